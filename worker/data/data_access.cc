#include "worker/data/data_access.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/data/fashion_mnist.h"

namespace pipetrain {
namespace {

absl::Mutex policy_mu(absl::kConstInit);
DataAccessPolicy* policy ABSL_GUARDED_BY(policy_mu) = nullptr;

// realpath(3): the absolute path with every `..` and symlink resolved.
absl::StatusOr<std::string> Resolve(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat("file not found: ", path));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot resolve ", path));
  }
  return std::string(resolved);
}

bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || absl::StartsWith(path, root + "/");
}

// PermissionDenied unless `resolved` (the resolved form of `path`) lies
// under one of the policy's roots.
absl::Status CheckRoots(const DataAccessPolicy& p, const std::string& path,
                        const std::string& resolved) {
  if (p.roots.empty()) return absl::OkStatus();
  for (const std::string& root : p.roots) {
    if (IsUnder(resolved, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("data path ", path, " (", resolved,
                   ") is outside the worker's data roots (--data_root ",
                   absl::StrJoin(p.roots, ","), ")"));
}

}  // namespace

absl::Status SetDataAccessPolicy(const DataAccessPolicy& p) {
  DataAccessPolicy resolved = p;
  resolved.roots.clear();
  for (const std::string& root : p.roots) {
    if (root.empty()) continue;
    // A root that does not exist (a dataset not installed here) holds
    // nothing; keep it as given rather than refuse to start.
    absl::StatusOr<std::string> r = Resolve(root);
    resolved.roots.push_back(r.ok() ? *std::move(r) : root);
  }
  absl::MutexLock lock(&policy_mu);
  delete policy;
  policy = new DataAccessPolicy(std::move(resolved));
  return absl::OkStatus();
}

DataAccessPolicy GetDataAccessPolicy() {
  absl::MutexLock lock(&policy_mu);
  return policy != nullptr ? *policy : DataAccessPolicy();
}

absl::StatusOr<std::string> CheckDataFile(const std::string& path) {
  const DataAccessPolicy p = GetDataAccessPolicy();
  ASSIGN_OR_RETURN(const std::string resolved, Resolve(path));
  RETURN_IF_ERROR(CheckRoots(p, path, resolved));
  struct stat info;
  if (::stat(resolved.c_str(), &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data path ", path,
                     " is not a regular file (devices, FIFOs, "
                     "sockets and directories are refused)"));
  }
  if (info.st_size > p.max_file_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", path, " holds ", info.st_size,
                     " bytes, more than the limit of ", p.max_file_bytes,
                     " (--max_data_file_bytes)"));
  }
  return resolved;
}

absl::Status CheckDatasetFiles(const v1::DatasetSpec& spec, DataParts parts) {
  if (!parts.any()) return absl::OkStatus();
  if (spec.has_char_corpus()) {
    for (const std::string& file : spec.char_corpus().files()) {
      RETURN_IF_ERROR(CheckDataFile(file).status());
    }
  }
  if (spec.has_numpy()) {
    const v1::NumpySource& n = spec.numpy();
    std::vector<const std::string*> files;
    if (parts.inputs) {
      files.insert(files.end(), {&n.train_features(), &n.eval_features()});
    }
    if (parts.labels) {
      files.insert(files.end(), {&n.train_labels(), &n.eval_labels()});
    }
    for (const std::string* file : files) {
      RETURN_IF_ERROR(CheckDataFile(*file).status());
    }
  }
  if (spec.has_token_shards()) {
    RETURN_IF_ERROR(CheckDataFile(spec.token_shards().train_file()).status());
    RETURN_IF_ERROR(CheckDataFile(spec.token_shards().eval_file()).status());
  }
  if (spec.has_fashion_mnist()) {
    const std::string dir = spec.fashion_mnist().dir().empty()
                                ? std::string(kDefaultFashionMnistDir)
                                : spec.fashion_mnist().dir();
    ASSIGN_OR_RETURN(const std::string resolved, Resolve(dir));
    RETURN_IF_ERROR(CheckRoots(GetDataAccessPolicy(), dir, resolved));
    for (const char* prefix :
         {kFashionMnistTrainPrefix, kFashionMnistEvalPrefix}) {
      std::vector<FashionMnistFile> files;
      if (parts.inputs) files.push_back(kImagesFile);
      if (parts.labels) files.push_back(kLabelsFile);
      for (FashionMnistFile file : files) {
        ASSIGN_OR_RETURN(const std::string path,
                         FindFashionMnistFile(dir, prefix, file));
        RETURN_IF_ERROR(CheckDataFile(path).status());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
