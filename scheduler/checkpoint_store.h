// CheckpointStore: the scheduler's checkpoints, in `checkpoints/` of its
// data directory (a PVC on Kubernetes).
//
// Layout: one safetensors file per model layer per checkpoint,
//   checkpoints/{job}/v{version}/layer-{i}.safetensors
// holding layer i's parameters and optimizer state (state_tensor.h names),
// with metadata format, job_id, version, step, optimizer_steps, layer; and
// the catalog, checkpoints/catalog.db (checkpoint_catalog.h).
//
// Crash consistency: each layer file is written atomically and durably
// (WriteFileAtomically: temporary file, fsync, rename, fsync of the
// directory) before it counts as landed; Commit inserts the catalog row,
// with every layer's size and CRC-32, in one SQLite transaction only when
// every layer of that version has landed. The row is the commit point: a
// checkpoint without one is never listed or loaded, whatever files exist,
// and Open removes such files (and temporary files) left by a crash.
// Retention deletes the rows of older checkpoints in the commit's own
// transaction, then their files, so a crash between the two leaves only
// unlisted files for the next Open to remove, and never more than `keep`
// listed. Loads verify
// sizes and checksums against the row.
//
// Thread-safe. Two locks: `mu_` guards the catalog and the pending
// (uncommitted) checkpoints and is held only briefly; `files_mu_` orders
// file I/O against removal: writers and readers hold it shared while they
// touch files, removals (retention, Discard, DeleteJob) exclusively, so a
// removal waits for in-flight writes and loads. Order: files_mu_, then mu_.
#ifndef PIPETRAIN_SCHEDULER_CHECKPOINT_STORE_H_
#define PIPETRAIN_SCHEDULER_CHECKPOINT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/durable_file.h"
#include "scheduler/checkpoint_catalog.h"
#include "scheduler/state_tensor.h"

namespace pipetrain {

struct LoadedCheckpoint {
  CheckpointInfo info;
  std::string spec_json;
  std::vector<StateTensor> tensors;  // layer 0's first, then layer 1's, ...
};

class CheckpointStore {
 public:
  // Opens `data_dir`/checkpoints (created when missing), its catalog, and
  // removes what a crash left: versions without a catalog row, temporary
  // files. Unavailable for I/O errors, DataLoss for a corrupt catalog.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      const std::string& data_dir);

  // Writes layer `layer` of checkpoint `version` of a job durably. Every
  // tensor must belong to that layer (layers.{layer}.* or
  // optimizer.layers.{layer}.*) and hold product(shape) * 4 bytes. All
  // layers of one version must carry the same step and optimizer_steps.
  // A layer without state (an activation) is written with no tensors: its
  // file still marks it landed. Writing a layer again replaces it.
  // InvalidArgument for bad arguments; FailedPrecondition when the version is
  // already committed (its files never change); Unavailable for I/O errors.
  absl::Status WriteLayer(const std::string& job_id, int64_t version,
                          int64_t step, int64_t optimizer_steps, int layer,
                          const std::vector<StateTensor>& tensors)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);

  // Commits checkpoint `version` once layers 0..num_layers-1 have landed
  // with this step, then keeps only the `keep` newest committed checkpoints
  // of the job. FailedPrecondition when a layer is missing or still being
  // written, or steps disagree; AlreadyExists when committed before;
  // InvalidArgument for keep < 1. Returns what was committed.
  absl::StatusOr<CheckpointInfo> Commit(const std::string& job_id,
                                        int64_t version, int64_t step,
                                        int num_layers,
                                        const std::string& spec_json, int keep)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);

  // Forgets an uncommitted checkpoint and removes its files (a stage failed
  // before every layer landed). Committed versions are left alone
  // (FailedPrecondition).
  absl::Status Discard(const std::string& job_id, int64_t version)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);

  // Committed checkpoints of a job, newest first (empty when none).
  absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The newest committed checkpoint; NotFound when the job has none.
  absl::StatusOr<CheckpointInfo> Latest(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // One layer's tensors of a committed checkpoint, size and checksum
  // verified. NotFound for a version (or layer) not committed; DataLoss
  // naming the file when it is missing, has the wrong size or checksum, or
  // does not parse.
  absl::StatusOr<std::vector<StateTensor>> LoadLayer(const std::string& job_id,
                                                     int64_t version, int layer)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);
  // Every layer (errors as LoadLayer).
  absl::StatusOr<LoadedCheckpoint> Load(const std::string& job_id,
                                        int64_t version)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);

  // The model export of a committed checkpoint (model_export.h): to a file
  // (written atomically), or in pieces to a sink (for an HTTP response).
  absl::Status WriteExport(const std::string& job_id, int64_t version,
                           const std::string& path)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);
  absl::Status StreamExport(const std::string& job_id, int64_t version,
                            const ByteSink& sink)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);

  // Removes every checkpoint of a job, committed or not (waits for its
  // in-flight writes).
  absl::Status DeleteJob(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(files_mu_, mu_);

  // checkpoints/ under the data directory.
  const std::string& root() const { return root_; }
  // Where a layer file lives (whether or not it exists).
  std::string LayerPath(const std::string& job_id, int64_t version,
                        int layer) const;

 private:
  // A checkpoint whose layers are still arriving.
  struct Pending {
    int64_t step = 0;
    int64_t optimizer_steps = 0;
    int writers = 0;  // WriteLayer calls in flight
    double write_seconds = 0;
    std::map<int, CheckpointLayerRecord> layers;
  };
  using Key = std::pair<std::string, int64_t>;  // (job, version)

  CheckpointStore(std::string root, std::unique_ptr<CheckpointCatalog> catalog)
      : root_(std::move(root)), catalog_(std::move(catalog)) {}

  std::string VersionDir(const std::string& job_id, int64_t version) const;
  absl::Status RemoveUncommitted() ABSL_LOCKS_EXCLUDED(files_mu_, mu_);
  absl::Status BeginWrite(const Key& key, int64_t step, int64_t optimizer_steps)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EndWrite(const Key& key, int layer,
                        absl::StatusOr<CheckpointLayerRecord> written,
                        double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // Inserts the catalog row (and deletes rows past `keep`, whose versions
  // land in `doomed` for their files to be removed).
  absl::StatusOr<CheckpointInfo> CommitLocked(const Key& key, int64_t step,
                                              int num_layers,
                                              const std::string& spec_json,
                                              int keep,
                                              std::vector<int64_t>* doomed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CheckpointRecord> Committed(const std::string& job_id,
                                             int64_t version)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<StateTensor>> ReadLayerFile(
      const CheckpointRecord& record, const CheckpointLayerRecord& layer)
      ABSL_SHARED_LOCKS_REQUIRED(files_mu_);
  absl::StatusOr<LoadedCheckpoint> LoadShared(const std::string& job_id,
                                              int64_t version)
      ABSL_SHARED_LOCKS_REQUIRED(files_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RemoveVersions(const std::string& job_id,
                              const std::vector<int64_t>& versions)
      ABSL_LOCKS_EXCLUDED(files_mu_);

  // Constant after construction.
  const std::string root_;

  absl::Mutex files_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::unique_ptr<CheckpointCatalog> catalog_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_CHECKPOINT_STORE_H_
