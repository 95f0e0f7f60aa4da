#include "scheduler/state_tensor.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace pipetrain {

bool IsParameterName(absl::string_view name) {
  return absl::StartsWith(name, kParameterPrefix);
}

std::optional<int> LayerOfStateTensor(absl::string_view name) {
  if (absl::StartsWith(name, kOptimizerPrefix)) {
    name.remove_prefix(kOptimizerPrefix.size());
  } else if (absl::StartsWith(name, kParameterPrefix)) {
    name.remove_prefix(kParameterPrefix.size());
  } else {
    return std::nullopt;
  }
  const size_t dot = name.find('.');
  // Digits only, then a dot and a non-empty rest: "3.weight", not "3" or
  // "+3.weight" or "03.weight".
  if (dot == absl::string_view::npos || dot == 0 || dot + 1 == name.size()) {
    return std::nullopt;
  }
  const absl::string_view index = name.substr(0, dot);
  for (const char c : index) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  if (index.size() > 1 && index[0] == '0') return std::nullopt;
  int layer = 0;
  if (!absl::SimpleAtoi(index, &layer)) return std::nullopt;
  return layer;
}

}  // namespace pipetrain
