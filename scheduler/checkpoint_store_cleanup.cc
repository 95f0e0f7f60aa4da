// CheckpointStore's cleanup at Open: what a crash (or a removal cut short)
// left behind is removed, so that the files on disk are exactly those of
// the committed checkpoints.
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/checkpoint_store.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

// (job -> version -> number of layers) of the committed checkpoints.
using CommittedMap = std::map<std::string, std::map<int64_t, int>>;

std::optional<int64_t> VersionOfDir(const std::string& name) {
  int64_t v = 0;
  if (name.size() < 2 || name[0] != 'v' ||
      !absl::SimpleAtoi(name.substr(1), &v) || v < 0 ||
      name != absl::StrCat("v", v)) {
    return std::nullopt;
  }
  return v;
}

absl::Status Remove(const fs::path& path) {
  PT_LOG(DEBUG) << "checkpoint store: removing " << path.string()
                << " (not part of a committed checkpoint)";
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "checkpoint store: remove ", path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<fs::path>> Children(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    out.push_back(it->path());
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "checkpoint store: list ", dir.string(), ": ", ec.message()));
  }
  return out;
}

// In a committed version's directory only its layer files stay.
absl::Status CleanVersionDir(const fs::path& dir, int num_layers) {
  std::set<std::string> keep;
  for (int i = 0; i < num_layers; ++i) {
    keep.insert(absl::StrCat("layer-", i, ".safetensors"));
  }
  ASSIGN_OR_RETURN(const std::vector<fs::path> files, Children(dir));
  bool removed = false;
  for (const fs::path& f : files) {
    if (keep.count(f.filename().string()) > 0) continue;
    RETURN_IF_ERROR(Remove(f));
    removed = true;
  }
  return removed ? SyncDirectory(dir.string()) : absl::OkStatus();
}

// Returns whether the job's directory is left empty.
absl::StatusOr<bool> CleanJobDir(const fs::path& dir,
                                 const std::map<int64_t, int>* committed) {
  ASSIGN_OR_RETURN(const std::vector<fs::path> entries, Children(dir));
  size_t kept = 0;
  bool removed = false;
  for (const fs::path& e : entries) {
    const std::optional<int64_t> v = VersionOfDir(e.filename().string());
    std::error_code ec;
    if (v.has_value() && committed != nullptr && committed->count(*v) > 0 &&
        fs::is_directory(e, ec)) {
      RETURN_IF_ERROR(CleanVersionDir(e, committed->at(*v)));
      ++kept;
      continue;
    }
    RETURN_IF_ERROR(Remove(e));
    removed = true;
  }
  if (removed) RETURN_IF_ERROR(SyncDirectory(dir.string()));
  return kept == 0;
}

}  // namespace

absl::Status CheckpointStore::RemoveUncommitted() {
  absl::MutexLock files(&files_mu_);
  CommittedMap committed;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const std::vector<CheckpointCatalog::Committed> all,
                     catalog_->AllCommitted());
    for (const CheckpointCatalog::Committed& c : all) {
      committed[c.job_id][c.version] = c.num_layers;
    }
  }
  ASSIGN_OR_RETURN(const std::vector<fs::path> entries, Children(root_));
  bool removed = false;
  for (const fs::path& e : entries) {
    const std::string name = e.filename().string();
    std::error_code ec;
    // The catalog and its WAL files; anything else not a directory was not
    // made by the store and is left alone.
    if (absl::StartsWith(name, "catalog.db") || !fs::is_directory(e, ec)) {
      continue;
    }
    auto it = committed.find(name);
    ASSIGN_OR_RETURN(
        const bool empty,
        CleanJobDir(e, it == committed.end() ? nullptr : &it->second));
    if (empty) {
      RETURN_IF_ERROR(Remove(e));
      removed = true;
    }
  }
  return removed ? SyncDirectory(root_) : absl::OkStatus();
}

}  // namespace pipetrain
