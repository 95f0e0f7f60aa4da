#include "worker/data/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_access.h"

namespace pipetrain {
namespace {

// Closes a descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }

 private:
  const int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(const std::string resolved, CheckDataFile(path));
  const int fd = ::open(resolved.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  FdCloser closer(fd);
  // The policy checked a path; what is mapped is this descriptor, so check
  // it again (a file replaced in between by a device or a larger file).
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  const int64_t max_bytes = GetDataAccessPolicy().max_file_bytes;
  if (!S_ISREG(info.st_mode) || info.st_size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", path,
                     " changed while opened: not a regular file or "
                     "more than --max_data_file_bytes = ",
                     max_bytes));
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size == 0) {
    return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  }
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (data == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot map ", path));
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace pipetrain
