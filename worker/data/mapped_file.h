// A data file mapped read-only into memory, so a dataset reads only the
// pages of the samples it touches and never copies the file whole.
//
// Open goes through the data access policy (data_access.h: under
// --data_root after realpath, a regular file, at most
// --max_data_file_bytes) and checks the opened descriptor again, so a file
// swapped after the check is not mapped. The mapping is private and
// read-only; a file truncated by someone else while mapped makes reads
// past its new end fault (SIGBUS), as with any mmap: datasets are expected
// to stay unchanged while a job reads them.
//
// Immutable after Open; thread-safe.
#ifndef PIPETRAIN_WORKER_DATA_MAPPED_FILE_H_
#define PIPETRAIN_WORKER_DATA_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

class MappedFile {
 public:
  // Errors name `path` as given: the policy's (PermissionDenied, NotFound,
  // InvalidArgument) or the system's (errno mapped).
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  // The whole file; empty for an empty file.
  absl::string_view bytes() const {
    return absl::string_view(static_cast<const char*>(data_), size_);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  int64_t size() const { return static_cast<int64_t>(size_); }

 private:
  MappedFile(std::string path, void* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  // Constant after construction. data_ is null for an empty file.
  const std::string path_;
  void* const data_;
  const size_t size_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_MAPPED_FILE_H_
