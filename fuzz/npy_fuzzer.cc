// Fuzzes the .npy header parser (worker/data/npy_header.h), which reads
// users' dataset files: any bytes into ParseNpyFile. Beyond "no crash, no
// sanitizer report": an accepted file's data lies exactly between the
// header's end and the end of the bytes, its element count is the product
// of its shape, and every element can be read (ASan checks the bounds).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "worker/data/npy_header.h"

namespace pipetrain {
// Where the element reads go, so the compiler keeps them.
volatile uint64_t npy_fuzzer_sink = 0;
}  // namespace pipetrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<NpyHeader> header = ParseNpyFile(bytes, "fuzz.npy");
  if (!header.ok()) return 0;
  const int64_t item = NpyItemSize(header->dtype);
  int64_t elements = 1;
  for (int64_t d : header->shape) {
    if (d < 0) __builtin_trap();
    elements *= d;
  }
  if (header->data_offset < 10 ||
      header->data_offset > static_cast<int64_t>(size) ||
      header->data_bytes != static_cast<int64_t>(size) - header->data_offset ||
      header->elements != elements || elements * item != header->data_bytes) {
    __builtin_trap();
  }
  const uint8_t* array = data + header->data_offset;
  uint64_t sum = 0;  // wraps; only keeps the reads
  for (int64_t i = 0; i < header->elements; ++i) {
    if (NpyIsInteger(header->dtype)) {
      sum += static_cast<uint64_t>(NpyIntegerAt(array, header->dtype, i));
    } else {
      float v;
      std::memcpy(&v, array + i * 4, 4);
      sum += v == v;
    }
  }
  pipetrain::npy_fuzzer_sink = sum;
  return 0;
}
