// Fuzzes the safetensors reader (common/safetensors.h), which reads
// checkpoints and model exports: any bytes into ParseSafetensors. Beyond
// "no crash, no sanitizer report": every tensor of an accepted file lies
// inside the buffer, and an accepted file written again by the writer
// parses to the same metadata, names, dtypes, shapes and bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace pipetrain {
namespace {

void CheckRoundTrip(absl::string_view bytes, const SafetensorsIndex& index) {
  std::vector<SafetensorsTensorView> views;
  for (const SafetensorsEntry& e : index.tensors) {
    views.push_back({e.name, e.dtype, e.shape, bytes.substr(e.offset, e.size)});
  }
  // The writer may refuse what the reader accepts (it also checks UTF-8);
  // what it writes must read back the same.
  absl::StatusOr<std::string> written =
      SerializeSafetensors(views, index.metadata);
  if (!written.ok()) return;
  absl::StatusOr<SafetensorsIndex> again = ParseSafetensors(*written);
  if (!again.ok() || again->metadata != index.metadata ||
      again->tensors.size() != index.tensors.size()) {
    __builtin_trap();
  }
  for (const SafetensorsEntry& e : again->tensors) {
    const SafetensorsEntry* before = nullptr;
    for (const SafetensorsEntry& b : index.tensors) {
      if (b.name == e.name) before = &b;
    }
    if (before == nullptr || before->dtype != e.dtype ||
        before->shape != e.shape ||
        bytes.substr(before->offset, before->size) !=
            absl::string_view(*written).substr(e.offset, e.size)) {
      __builtin_trap();
    }
  }
}

}  // namespace
}  // namespace pipetrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(bytes);
  if (!index.ok()) return 0;
  for (const SafetensorsEntry& e : index->tensors) {
    if (e.offset > size || e.size > size - e.offset) __builtin_trap();
  }
  CheckRoundTrip(bytes, *index);
  return 0;
}
