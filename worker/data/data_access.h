// Which files a dataset may be read from. A job spec names its data files,
// and specs come from users over the network, so a worker opens only
// regular files (no devices, FIFOs or sockets), resolved with realpath (no
// `..` or symlink leaves a root), under its data roots, and reads at most
// a capped number of bytes from each (a gzip file's inflated bytes too).
//
// The policy is process-wide: a worker sets it once from its flags before
// it serves anything, and every ByteFile::Open checks against it. Without
// roots (the default, for in-process tools and tests) any regular file
// passes the path check; the type and size checks always apply.
//
// Thread-safe.
#ifndef PIPETRAIN_WORKER_DATA_DATA_ACCESS_H_
#define PIPETRAIN_WORKER_DATA_DATA_ACCESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"

namespace pipetrain {

// The worker's --data_root default: where the examples' data lives (the
// Debian packages dataset-fashion-mnist and fortunes).
inline constexpr char kDefaultDataRoots[] =
    "/usr/share/datasets,/usr/share/games/fortunes";
inline constexpr int64_t kDefaultMaxDataFileBytes = int64_t{1} << 30;

struct DataAccessPolicy {
  // Directories data may come from; empty: anywhere.
  std::vector<std::string> roots;
  // Bytes one data file may yield (after gzip inflation).
  int64_t max_file_bytes = kDefaultMaxDataFileBytes;
};

// Replaces the process's policy. Roots are resolved here (realpath); one
// that does not exist is kept as given (nothing lies under it).
absl::Status SetDataAccessPolicy(const DataAccessPolicy& policy);
DataAccessPolicy GetDataAccessPolicy();

// The resolved path of `path` when the policy allows reading it:
// PermissionDenied when it lies outside every root, InvalidArgument when it
// is not a regular file or is larger than the cap, NotFound when it does
// not exist. Errors name the path as given.
absl::StatusOr<std::string> CheckDataFile(const std::string& path);

// Checks, without reading them, the files of a dataset spec that a reader
// of `parts` opens (OpenDataset): the .npy features files for inputs and
// the labels files for labels; the Fashion-MNIST directory and its images
// or labels files; every character-corpus or token-shard file for either
// part; none for no part (a middle stage). What a worker runs before it
// touches a running stage. Errors name the file.
absl::Status CheckDatasetFiles(const v1::DatasetSpec& spec,
                               DataParts parts = kAllDataParts);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_DATA_ACCESS_H_
