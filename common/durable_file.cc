#include "common/durable_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status ErrnoError(absl::string_view op, const std::string& path,
                        int err) {
  const std::string message = absl::StrCat(op, " ", path, ": ", strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error that close may carry (NFS and others
  // report deferred write errors there).
  int Close() {
    const int rc = close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

std::string ParentOf(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// A name no other writer uses: the pid tells processes apart, the counter
// calls within one; O_EXCL catches a stale file of an earlier process that
// had the same pid.
absl::StatusOr<int> CreateTempFile(const std::string& path, std::string* name) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    *name = absl::StrCat(path, kTempFileMarker, getpid(), "-",
                         counter.fetch_add(1));
    const int fd =
        open(name->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return ErrnoError("create", *name, errno);
  }
  return absl::UnavailableError(
      absl::StrCat("create a temporary file for ", path, ": names in use"));
}

}  // namespace

absl::Status SyncDirectory(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open directory", dir, errno);
  if (fsync(fd.get()) != 0) return ErrnoError("fsync directory", dir, errno);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(
    const std::string& path,
    const std::function<absl::Status(const ByteSink& sink)>& produce) {
  std::string temp;
  ASSIGN_OR_RETURN(const int raw_fd, CreateTempFile(path, &temp));
  Fd fd(raw_fd);
  absl::Status status = produce(
      [&](absl::string_view piece) { return WriteAll(fd.get(), piece, temp); });
  if (status.ok() && fsync(fd.get()) != 0) {
    status = ErrnoError("fsync", temp, errno);
  }
  if (fd.Close() != 0 && status.ok()) status = ErrnoError("close", temp, errno);
  if (status.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(absl::StrCat("rename ", temp, " to"), path, errno);
  }
  if (!status.ok()) {
    unlink(temp.c_str());
    return status;
  }
  // The rename is durable only once the directory entry is.
  return SyncDirectory(ParentOf(path));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view content) {
  return WriteFileAtomically(
      path, [content](const ByteSink& sink) { return sink(content); });
}

absl::Status CreateDirectoriesDurably(const std::string& dir) {
  // Walk up to the first existing ancestor, then create downwards, syncing
  // each parent so the new entry is durable.
  std::vector<std::filesystem::path> missing;
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) {
    missing.push_back(p);
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (mkdir(it->c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("create directory", it->string(), errno);
    }
    RETURN_IF_ERROR(SyncDirectory(ParentOf(it->string())));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected
  // by the fstat check below anyway.
  Fd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open", path, errno);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", size, " bytes, more than the limit of ", max_bytes));
  }
  std::string content(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd.get(), content.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read", path, errno);
    if (n == 0) break;  // shrank while being read
    done += static_cast<size_t>(n);
  }
  if (done != size) {
    return absl::UnavailableError(absl::StrCat(
        path, ": changed while being read (", done, " of ", size, " bytes)"));
  }
  return content;
}

}  // namespace pipetrain
