#include "common/shape.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) {
    return std::nullopt;
  }
  return out;
}

std::optional<int64_t> CheckedNumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    const std::optional<int64_t> next = CheckedMul(n, d);
    if (!next.has_value()) return std::nullopt;
    n = *next;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace pipetrain
