// The safetensors file format (the format of Hugging Face's `safetensors`
// library), used for checkpoints and model exports:
//
//   8 bytes    N, the header length, unsigned little-endian
//   N bytes    a JSON object: "__metadata__" (optional) maps strings to
//              strings; every other key is a tensor name mapped to
//              {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
//              with offsets relative to the start of the data; the
//              writer pads it with spaces to a multiple of 8 bytes
//   the data   every tensor's little-endian bytes, back to back
//
// The reader trusts nothing: every rule of the reference implementation is
// checked (header length within the buffer and under 100 MB, well-formed
// JSON of the expected shape without duplicate keys, known dtypes, unique
// non-empty names, offsets in range, contiguous from 0 to the end of the
// buffer without overlap or gaps, each tensor's size == product(shape) *
// dtype size without overflow, metadata values strings). A violation is
// InvalidArgument saying what is wrong and where (callers prefix the file
// name). JSON syntax comes from nlohmann/json (Debian nlohmann-json3-dev);
// only the checks above are ours.
//
// Compute-free and transport-free: the scheduler links it. Free functions
// and value types; thread-compatible.
#ifndef PIPETRAIN_COMMON_SAFETENSORS_H_
#define PIPETRAIN_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/durable_file.h"

namespace pipetrain {

// The element types of the format, in the reference implementation's
// order. Names ("F32", ...) and sizes are converted in this file only.
enum class SafetensorsDtype {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
// InvalidArgument naming `name` when it is not a dtype of the format.
absl::StatusOr<SafetensorsDtype> SafetensorsDtypeFromName(
    absl::string_view name);
size_t SafetensorsDtypeSize(SafetensorsDtype dtype);

using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor to write; `data` is borrowed and must outlive the write.
struct SafetensorsTensorView {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  absl::string_view data;
};

// One tensor of a parsed file: where its bytes are in the buffer.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the buffer (header included)
  uint64_t size = 0;    // bytes
};

// What a valid buffer holds; tensors in the order of their data.
struct SafetensorsIndex {
  SafetensorsMetadata metadata;
  std::vector<SafetensorsEntry> tensors;
};

// The reference implementation's limit on the header.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Validates a whole file's bytes (see the rules above) and returns its
// index; the bytes are not copied. InvalidArgument on any violation.
absl::StatusOr<SafetensorsIndex> ParseSafetensors(absl::string_view bytes);

// A parsed file that owns its bytes.
class SafetensorsFile {
 public:
  // Takes the bytes and validates them (InvalidArgument as above).
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes);

  const SafetensorsMetadata& metadata() const { return index_.metadata; }
  const std::vector<SafetensorsEntry>& tensors() const {
    return index_.tensors;
  }
  // nullptr when no tensor has that name.
  const SafetensorsEntry* Find(absl::string_view name) const;
  // The bytes of a tensor of this file.
  absl::string_view Data(const SafetensorsEntry& entry) const {
    return absl::string_view(bytes_).substr(entry.offset, entry.size);
  }
  uint64_t size_bytes() const { return bytes_.size(); }

 private:
  SafetensorsFile(std::string bytes, SafetensorsIndex index)
      : bytes_(std::move(bytes)), index_(std::move(index)) {}
  std::string bytes_;
  SafetensorsIndex index_;
};

// Reads and validates the regular file at `path`, at most `max_bytes`
// long. Errors from ReadRegularFile; InvalidArgument prefixed with the path
// when the content is not a valid file.
absl::StatusOr<SafetensorsFile> ReadSafetensorsFile(const std::string& path,
                                                    uint64_t max_bytes);

// ---- Writing ----

// Writes a file's bytes to `sink`: the header (tensors laid out by
// decreasing element size, then name, as the reference writer does, so each
// tensor's data is aligned to its element size), then the data, without
// copying it. InvalidArgument (before anything is written) for an empty,
// duplicate or reserved name, a negative dimension, data whose size is not
// product(shape) * dtype size, or a name or metadata that is not UTF-8.
absl::Status WriteSafetensors(const std::vector<SafetensorsTensorView>& tensors,
                              const SafetensorsMetadata& metadata,
                              const ByteSink& sink);

// The same into a string.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<SafetensorsTensorView>& tensors,
    const SafetensorsMetadata& metadata);

// The number of elements of `shape`, or InvalidArgument for a negative
// dimension or a product that overflows 63 bits.
absl::StatusOr<uint64_t> SafetensorsElementCount(
    const std::vector<int64_t>& shape);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SAFETENSORS_H_
