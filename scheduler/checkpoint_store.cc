#include "scheduler/checkpoint_store.h"

#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/elapsed.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "scheduler/model_export.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

constexpr char kCheckpointsDir[] = "checkpoints";
constexpr char kCatalogFile[] = "catalog.db";
constexpr char kLayerFormat[] = "pipetrain-checkpoint-v1";
constexpr size_t kMaxJobIdLength = 128;

// Job ids become directory names: a conservative alphabet keeps them from
// escaping the store ("..", "/") or colliding with the catalog's files.
absl::Status ValidateJobId(const std::string& job_id) {
  bool ok = !job_id.empty() && job_id.size() <= kMaxJobIdLength;
  for (const char c : job_id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                (c >= '0' && c <= '9') || c == '-' || c == '_');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint store: job id \"", job_id,
                   "\" must be 1 to 128 letters, digits, '-' or '_'"));
}

std::string Describe(const std::string& job_id, int64_t version) {
  return absl::StrCat("checkpoint v", version, " of job ", job_id);
}

absl::Status CheckTensors(int layer, const std::vector<StateTensor>& tensors) {
  for (const StateTensor& t : tensors) {
    const std::optional<int> owner = LayerOfStateTensor(t.name);
    if (!owner.has_value() || *owner != layer) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint store: tensor \"", t.name,
                       "\" does not belong to layer ", layer));
    }
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "checkpoint store: remove ", path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    const std::string& data_dir) {
  const std::string root = (fs::path(data_dir) / kCheckpointsDir).string();
  RETURN_IF_ERROR(CreateDirectoriesDurably(root));
  ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointCatalog> catalog,
      CheckpointCatalog::Open((fs::path(root) / kCatalogFile).string()));
  std::unique_ptr<CheckpointStore> store(
      new CheckpointStore(root, std::move(catalog)));
  RETURN_IF_ERROR(store->RemoveUncommitted());
  return store;
}

std::string CheckpointStore::VersionDir(const std::string& job_id,
                                        int64_t version) const {
  return (fs::path(root_) / job_id / absl::StrCat("v", version)).string();
}

std::string CheckpointStore::LayerPath(const std::string& job_id,
                                       int64_t version, int layer) const {
  return (fs::path(VersionDir(job_id, version)) /
          absl::StrCat("layer-", layer, ".safetensors"))
      .string();
}

// ---- Writing and committing ----

absl::Status CheckpointStore::WriteLayer(
    const std::string& job_id, int64_t version, int64_t step,
    int64_t optimizer_steps, int layer,
    const std::vector<StateTensor>& tensors) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  if (version < 0 || step < 0 || optimizer_steps < 0 || layer < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint store: negative version, step, optimizer steps or layer "
        "(",
        version, ", ", step, ", ", optimizer_steps, ", ", layer, ")"));
  }
  RETURN_IF_ERROR(CheckTensors(layer, tensors));
  std::vector<SafetensorsTensorView> views;
  for (const StateTensor& t : tensors) {
    views.push_back({t.name, SafetensorsDtype::kF32, t.shape, t.data});
  }
  const SafetensorsMetadata metadata = {
      {"format", kLayerFormat},
      {"job_id", job_id},
      {"version", absl::StrCat(version)},
      {"step", absl::StrCat(step)},
      {"optimizer_steps", absl::StrCat(optimizer_steps)},
      {"layer", absl::StrCat(layer)}};

  absl::ReaderMutexLock files(&files_mu_);
  const Key key(job_id, version);
  RETURN_IF_ERROR(BeginWrite(key, step, optimizer_steps));
  const auto start = std::chrono::steady_clock::now();
  CheckpointLayerRecord record;
  record.layer = layer;
  uLong crc = crc32_z(0L, Z_NULL, 0);
  absl::Status status = CreateDirectoriesDurably(VersionDir(job_id, version));
  if (status.ok()) {
    status = WriteFileAtomically(
        LayerPath(job_id, version, layer), [&](const ByteSink& sink) {
          return WriteSafetensors(views, metadata, [&](absl::string_view p) {
            crc = crc32_z(crc, reinterpret_cast<const Bytef*>(p.data()),
                          p.size());
            record.bytes += static_cast<int64_t>(p.size());
            return sink(p);
          });
        });
  }
  record.crc32 = static_cast<uint32_t>(crc);
  absl::StatusOr<CheckpointLayerRecord> written = record;
  if (!status.ok()) written = status;
  return EndWrite(key, layer, std::move(written), SecondsSince(start));
}

absl::Status CheckpointStore::BeginWrite(const Key& key, int64_t step,
                                         int64_t optimizer_steps) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const std::optional<CheckpointRecord> committed,
                   catalog_->Get(key.first, key.second));
  if (committed.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(key.first, key.second),
                     " is committed; its files never "
                     "change"));
  }
  Pending& p = pending_[key];
  if (p.writers == 0 && p.layers.empty()) {
    p.step = step;
    p.optimizer_steps = optimizer_steps;
  } else if (p.step != step || p.optimizer_steps != optimizer_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(key.first, key.second), ": a layer at step ", step, " with ",
        optimizer_steps, " optimizer steps, but its other layers are at step ",
        p.step, " with ", p.optimizer_steps));
  }
  ++p.writers;
  return absl::OkStatus();
}

absl::Status CheckpointStore::EndWrite(
    const Key& key, int layer, absl::StatusOr<CheckpointLayerRecord> written,
    double seconds) {
  absl::MutexLock lock(&mu_);
  Pending& p = pending_[key];
  --p.writers;
  if (written.ok()) {
    p.layers[layer] = *written;
    p.write_seconds += seconds;
  } else {
    p.layers.erase(layer);  // a failed rewrite may have left the old file
  }
  if (p.writers == 0 && p.layers.empty()) pending_.erase(key);
  return written.status();
}

absl::StatusOr<CheckpointInfo> CheckpointStore::Commit(
    const std::string& job_id, int64_t version, int64_t step, int num_layers,
    const std::string& spec_json, int keep) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  if (keep < 1 || num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint store: commit needs keep >= 1 and num_layers >= 1 (got ",
        keep, ", ", num_layers, ")"));
  }
  CheckpointInfo info;
  std::vector<int64_t> doomed;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(info, CommitLocked(Key(job_id, version), step, num_layers,
                                        spec_json, keep, &doomed));
  }
  const absl::Status removed = RemoveVersions(job_id, doomed);
  if (!removed.ok()) PT_LOG(WARNING) << removed.ToString();  // Open retries
  return info;
}

absl::StatusOr<CheckpointInfo> CheckpointStore::CommitLocked(
    const Key& key, int64_t step, int num_layers, const std::string& spec_json,
    int keep, std::vector<int64_t>* doomed) {
  const auto start = std::chrono::steady_clock::now();
  const std::string what = Describe(key.first, key.second);
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    ASSIGN_OR_RETURN(const std::optional<CheckpointRecord> committed,
                     catalog_->Get(key.first, key.second));
    if (committed.has_value()) {
      return absl::AlreadyExistsError(absl::StrCat(what, " is committed"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": no layer has been written"));
  }
  const Pending& p = it->second;
  if (p.writers > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", p.writers, " layer writes in flight"));
  }
  if (p.step != step) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": its layers are at step ", p.step, ", not ", step));
  }
  CheckpointRecord record;
  std::vector<std::string> missing;
  for (int layer = 0; layer < num_layers; ++layer) {
    auto l = p.layers.find(layer);
    if (l == p.layers.end()) {
      missing.push_back(absl::StrCat(layer));
      continue;
    }
    record.layers.push_back(l->second);
    record.info.bytes += l->second.bytes;
  }
  if (!missing.empty() || p.layers.rbegin()->first >= num_layers) {
    return absl::FailedPreconditionError(
        missing.empty()
            ? absl::StrCat(what, ": layer ", p.layers.rbegin()->first,
                           " was written but the model has ", num_layers,
                           " layers")
            : absl::StrCat(what, ": ", p.layers.size(), " of ", num_layers,
                           " layers landed; missing ",
                           absl::StrJoin(missing, ", ")));
  }
  record.info.job_id = key.first;
  record.info.version = key.second;
  record.info.step = step;
  record.info.optimizer_steps = p.optimizer_steps;
  record.info.num_layers = num_layers;
  record.info.created_unix_ms = absl::ToUnixMillis(absl::Now());
  record.info.write_seconds = p.write_seconds + SecondsSince(start);
  record.spec_json = spec_json;
  ASSIGN_OR_RETURN(*doomed, catalog_->Insert(record, keep));
  pending_.erase(it);
  return record.info;
}

absl::Status CheckpointStore::Discard(const std::string& job_id,
                                      int64_t version) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock files(&files_mu_);  // no write in flight
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const std::optional<CheckpointRecord> committed,
                     catalog_->Get(job_id, version));
    if (committed.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(job_id, version), " is committed"));
    }
    pending_.erase(Key(job_id, version));
  }
  RETURN_IF_ERROR(RemoveAll(VersionDir(job_id, version)));
  const std::string job_dir = (fs::path(root_) / job_id).string();
  std::error_code ec;
  return fs::exists(job_dir, ec) ? SyncDirectory(job_dir) : absl::OkStatus();
}

absl::Status CheckpointStore::RemoveVersions(
    const std::string& job_id, const std::vector<int64_t>& versions) {
  if (versions.empty()) return absl::OkStatus();
  absl::MutexLock files(&files_mu_);  // no load reading them
  for (const int64_t v : versions) {
    RETURN_IF_ERROR(RemoveAll(VersionDir(job_id, v)));
  }
  return SyncDirectory((fs::path(root_) / job_id).string());
}

absl::Status CheckpointStore::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock files(&files_mu_);  // waits for in-flight writes
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(catalog_->DeleteJob(job_id));
    for (auto it = pending_.begin(); it != pending_.end();) {
      it = it->first.first == job_id ? pending_.erase(it) : std::next(it);
    }
  }
  RETURN_IF_ERROR(RemoveAll(fs::path(root_) / job_id));
  return SyncDirectory(root_);
}

// ---- Listing and loading ----

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointStore::List(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  return catalog_->List(job_id);
}

absl::StatusOr<CheckpointInfo> CheckpointStore::Latest(
    const std::string& job_id) {
  ASSIGN_OR_RETURN(const std::vector<CheckpointInfo> all, List(job_id));
  if (all.empty()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_id, " has no committed checkpoint"));
  }
  return all.front();
}

absl::StatusOr<CheckpointRecord> CheckpointStore::Committed(
    const std::string& job_id, int64_t version) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::optional<CheckpointRecord> record,
                   catalog_->Get(job_id, version));
  if (!record.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, " has no committed checkpoint v", version));
  }
  return std::move(*record);
}

absl::StatusOr<std::vector<StateTensor>> CheckpointStore::ReadLayerFile(
    const CheckpointRecord& record, const CheckpointLayerRecord& layer) {
  const CheckpointInfo& info = record.info;
  const std::string path = LayerPath(info.job_id, info.version, layer.layer);
  auto data_loss = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(Describe(info.job_id, info.version),
                                            ": ", path, ": ", what));
  };
  absl::StatusOr<std::string> bytes =
      ReadRegularFile(path, static_cast<uint64_t>(layer.bytes));
  if (!bytes.ok()) return data_loss(bytes.status().message());
  if (static_cast<int64_t>(bytes->size()) != layer.bytes) {
    return data_loss(
        absl::StrCat(bytes->size(), " bytes, the catalog says ", layer.bytes));
  }
  const uLong crc =
      crc32_z(crc32_z(0L, Z_NULL, 0),
              reinterpret_cast<const Bytef*>(bytes->data()), bytes->size());
  if (static_cast<uint32_t>(crc) != layer.crc32) {
    return data_loss("checksum differs from the catalog's (corrupt file)");
  }
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::FromBytes(*std::move(bytes));
  if (!file.ok()) return data_loss(file.status().message());
  const SafetensorsMetadata& m = file->metadata();
  auto field = [&m](const char* key) {
    auto it = m.find(key);
    return it == m.end() ? std::string() : it->second;
  };
  if (field("job_id") != info.job_id ||
      field("version") != absl::StrCat(info.version) ||
      field("layer") != absl::StrCat(layer.layer)) {
    return data_loss("the file belongs to another checkpoint or layer");
  }
  std::vector<StateTensor> tensors;
  for (const SafetensorsEntry& e : file->tensors()) {
    if (e.dtype != SafetensorsDtype::kF32)
      return data_loss("a tensor is not F32");
    tensors.push_back({e.name, e.shape, std::string(file->Data(e))});
  }
  return tensors;
}

absl::StatusOr<std::vector<StateTensor>> CheckpointStore::LoadLayer(
    const std::string& job_id, int64_t version, int layer) {
  absl::ReaderMutexLock files(&files_mu_);
  ASSIGN_OR_RETURN(const CheckpointRecord record, Committed(job_id, version));
  for (const CheckpointLayerRecord& l : record.layers) {
    if (l.layer == layer) return ReadLayerFile(record, l);
  }
  return absl::NotFoundError(absl::StrCat(Describe(job_id, version), " has ",
                                          record.info.num_layers,
                                          " layers, not layer ", layer));
}

absl::StatusOr<LoadedCheckpoint> CheckpointStore::LoadShared(
    const std::string& job_id, int64_t version) {
  ASSIGN_OR_RETURN(const CheckpointRecord record, Committed(job_id, version));
  LoadedCheckpoint loaded;
  loaded.info = record.info;
  loaded.spec_json = record.spec_json;
  for (const CheckpointLayerRecord& l : record.layers) {
    ASSIGN_OR_RETURN(std::vector<StateTensor> tensors,
                     ReadLayerFile(record, l));
    for (StateTensor& t : tensors) loaded.tensors.push_back(std::move(t));
  }
  return loaded;
}

absl::StatusOr<LoadedCheckpoint> CheckpointStore::Load(
    const std::string& job_id, int64_t version) {
  absl::ReaderMutexLock files(&files_mu_);
  return LoadShared(job_id, version);
}

absl::Status CheckpointStore::StreamExport(const std::string& job_id,
                                           int64_t version,
                                           const ByteSink& sink) {
  // Loaded under the lock, streamed without it: a slow reader of the
  // export must not hold back retention.
  ASSIGN_OR_RETURN(const LoadedCheckpoint loaded, Load(job_id, version));
  const ExportInfo info{job_id, loaded.info.step, loaded.info.version,
                        loaded.spec_json};
  return WriteModelExport(loaded.tensors, info, sink);
}

absl::Status CheckpointStore::WriteExport(const std::string& job_id,
                                          int64_t version,
                                          const std::string& path) {
  return WriteFileAtomically(path, [&](const ByteSink& sink) {
    return StreamExport(job_id, version, sink);
  });
}

}  // namespace pipetrain
