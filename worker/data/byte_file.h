// Reading whole files or exact byte counts from files that may be
// gzip-compressed. zlib's gzread passes plain files through unchanged, so
// callers need not know which kind they were given.
#ifndef PIPETRAIN_WORKER_DATA_BYTE_FILE_H_
#define PIPETRAIN_WORKER_DATA_BYTE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// True when `path` names an existing file or directory.
bool PathExists(const std::string& path);

// A file opened for reading, gzip or plain. Not thread-safe; owned by the
// one caller that reads it.
class ByteFile {
 public:
  // NotFound (naming `path`) when the file does not exist; the data
  // access policy's errors (data_access.h: outside the roots, not a
  // regular file, too large); other open failures map from errno. Reads
  // fail once the file has yielded the policy's max_file_bytes.
  static absl::StatusOr<std::unique_ptr<ByteFile>> Open(
      const std::string& path);
  ~ByteFile();
  ByteFile(const ByteFile&) = delete;
  ByteFile& operator=(const ByteFile&) = delete;

  const std::string& path() const { return path_; }

  // Appends exactly `n` bytes to `out`. DataLoss naming the file and `what`
  // when the file ends (or the gzip stream breaks) first. Memory grows with
  // the bytes actually read, so a header that promises absurd sizes cannot
  // make this allocate them.
  absl::Status ReadExactly(size_t n, absl::string_view what,
                           std::vector<uint8_t>* out);

  // Appends everything up to the end of the file to `out`.
  absl::Status ReadToEnd(std::vector<uint8_t>* out);

 private:
  // `file` is zlib's gzFile, kept opaque so zlib.h stays out of this header.
  ByteFile(std::string path, void* file, int64_t max_bytes);
  // Appends up to `n` bytes; fewer only at the end of the file.
  absl::Status ReadUpTo(size_t n, std::vector<uint8_t>* out);

  // Constant after construction.
  const std::string path_;
  void* const file_;
  const int64_t max_bytes_;
  int64_t read_ = 0;  // bytes yielded so far
};

// Reads a whole (gzip or plain) file.
absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_BYTE_FILE_H_
