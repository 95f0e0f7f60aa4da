// The header of a NumPy .npy file (numpy.lib.format, versions 1.0, 2.0 and
// 3.0), parsed from the file's bytes without Python: the magic string, the
// version, the header length and the header's Python-literal dict with
// exactly the keys 'descr', 'fortran_order' and 'shape'.
//
// Only what the datasets can read is accepted: little-endian (or
// one-byte) integers and float32, C order. Everything else, and any
// malformed or truncated header, is an error naming the file; the parser
// never reads outside the bytes it is given (fuzz/npy_fuzzer.cc).
#ifndef PIPETRAIN_WORKER_DATA_NPY_HEADER_H_
#define PIPETRAIN_WORKER_DATA_NPY_HEADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

enum class NpyDtype {
  kFloat32,
  kInt8,
  kUint8,
  kInt16,
  kUint16,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
};

// Bytes per element, and the NumPy name ("float32", "uint8", ...).
int64_t NpyItemSize(NpyDtype dtype);
const char* NpyDtypeName(NpyDtype dtype);
bool NpyIsInteger(NpyDtype dtype);

// Headers longer than this are refused (NumPy itself refuses more than
// 10000 bytes by default since 1.24.3).
inline constexpr int64_t kMaxNpyHeaderBytes = 65536;

struct NpyHeader {
  NpyDtype dtype = NpyDtype::kFloat32;
  std::vector<int64_t> shape;  // () is a scalar: one element
  int64_t elements = 1;        // product of shape
  int64_t data_offset = 0;     // where the array's bytes start
  int64_t data_bytes = 0;      // elements * item size
};

// Parses the header at the start of `file` (the whole file's bytes) and
// checks that the file holds exactly the data it announces. `name` is put
// in every error (the path as the spec gave it). InvalidArgument for a
// malformed or unsupported header, DataLoss for a file shorter or longer
// than its header says.
absl::StatusOr<NpyHeader> ParseNpyFile(absl::string_view file,
                                       const std::string& name);

// The element at `index` of an integer array's data as int64; uint64
// values above INT64_MAX come back negative (callers check ranges).
int64_t NpyIntegerAt(const uint8_t* data, NpyDtype dtype, int64_t index);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_NPY_HEADER_H_
