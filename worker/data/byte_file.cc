#include "worker/data/byte_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_access.h"

namespace pipetrain {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr unsigned kZlibBufferBytes = 256u << 10;

gzFile AsGz(void* file) { return static_cast<gzFile>(file); }

// zlib's description of the file's last error; empty when there is none.
std::string GzError(gzFile file) {
  int errnum = Z_OK;
  const char* message = gzerror(file, &errnum);
  if (errnum == Z_OK) return "";
  if (errnum == Z_ERRNO) return std::strerror(errno);
  return message != nullptr ? message : "unknown zlib error";
}

}  // namespace

bool PathExists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

ByteFile::ByteFile(std::string path, void* file, int64_t max_bytes)
    : path_(std::move(path)), file_(file), max_bytes_(max_bytes) {}

ByteFile::~ByteFile() { gzclose(AsGz(file_)); }

absl::StatusOr<std::unique_ptr<ByteFile>> ByteFile::Open(
    const std::string& path) {
  // The policy's path, type and size checks (data_access.h); the file
  // opened is the resolved one, so nothing can swap a link in between the
  // check and the open but a rename inside the root.
  ASSIGN_OR_RETURN(const std::string resolved, CheckDataFile(path));
  errno = 0;
  gzFile file = gzopen(resolved.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("file not found: ", path));
    }
    if (error == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot open ", path, ": zlib is out of memory"));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open ", path));
  }
  gzbuffer(file, kZlibBufferBytes);
  return std::unique_ptr<ByteFile>(
      new ByteFile(path, file, GetDataAccessPolicy().max_file_bytes));
}

absl::Status ByteFile::ReadUpTo(size_t n, std::vector<uint8_t>* out) {
  size_t remaining = n;
  while (remaining > 0) {
    const size_t chunk = std::min(remaining, kChunkBytes);
    const size_t old_size = out->size();
    out->resize(old_size + chunk);
    const int got = gzread(AsGz(file_), out->data() + old_size,
                           static_cast<unsigned>(chunk));
    const size_t kept = got > 0 ? static_cast<size_t>(got) : 0;
    out->resize(old_size + kept);
    read_ += static_cast<int64_t>(kept);
    if (read_ > max_bytes_) {
      // A gzip file inflates past its size on disk: cap what it yields
      // (at most one chunk is read past the cap).
      return absl::InvalidArgumentError(
          absl::StrCat(path_, " yields more than ", max_bytes_,
                       " bytes, the limit (--max_data_file_bytes)"));
    }
    // A short read means the end of the file or an error; a gzip stream cut
    // short shows up as an error here even when gzread returned 0.
    if (kept < chunk) {
      const std::string error = GzError(AsGz(file_));
      if (!error.empty()) {
        return absl::DataLossError(
            absl::StrCat("cannot read ", path_, ": ", error));
      }
      break;
    }
    remaining -= kept;
  }
  return absl::OkStatus();
}

absl::Status ByteFile::ReadExactly(size_t n, absl::string_view what,
                                   std::vector<uint8_t>* out) {
  const size_t old_size = out->size();
  if (absl::Status status = ReadUpTo(n, out); !status.ok()) {
    return absl::DataLossError(
        absl::StrCat(status.message(), " (while reading ", what, ")"));
  }
  const size_t got = out->size() - old_size;
  if (got < n) {
    return absl::DataLossError(absl::StrCat(path_, " is truncated: expected ",
                                            n, " bytes of ", what, ", found ",
                                            got));
  }
  return absl::OkStatus();
}

absl::Status ByteFile::ReadToEnd(std::vector<uint8_t>* out) {
  while (true) {
    const size_t old_size = out->size();
    RETURN_IF_ERROR(ReadUpTo(kChunkBytes, out));
    if (out->size() - old_size < kChunkBytes) return absl::OkStatus();
  }
}

absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteFile> file, ByteFile::Open(path));
  std::vector<uint8_t> bytes;
  RETURN_IF_ERROR(file->ReadToEnd(&bytes));
  return bytes;
}

}  // namespace pipetrain
