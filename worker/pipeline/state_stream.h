// A stage's training state as a stream of StateChunks
// (pipetrain/v1/stage.proto), both ways, transport-free: StateChunker cuts
// a snapshot into chunks for FetchSnapshot; StateAssembler puts the chunks
// of a RestoreState stream back together, checking each one before
// anything is allocated for it.
#ifndef PIPETRAIN_WORKER_PIPELINE_STATE_STREAM_H_
#define PIPETRAIN_WORKER_PIPELINE_STATE_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/stage.pb.h"
#include "worker/nn/model_state.h"
#include "worker/pipeline/stage_snapshot.h"

namespace pipetrain {

// Data bytes per chunk (the contract's "about 1 MiB").
inline constexpr size_t kStateChunkBytes = size_t{1} << 20;

// Cuts a snapshot into chunks of at most `max_bytes` data each, tensor by
// tensor in name order; every chunk carries the snapshot's step, weight
// version and optimizer steps. A snapshot without tensors (a stage without
// parameters) gives no chunks. Not thread-safe; keeps the snapshot alive.
class StateChunker {
 public:
  StateChunker(std::string job_id,
               std::shared_ptr<const StageStateSnapshot> snapshot,
               size_t max_bytes = kStateChunkBytes);

  // Fills *chunk with the next piece; false when none is left.
  bool Next(v1::StateChunk* chunk);

 private:
  const std::string job_id_;
  const std::shared_ptr<const StageStateSnapshot> snapshot_;
  const size_t max_bytes_;
  std::map<std::string, Tensor>::const_iterator tensor_;
  int64_t offset_ = 0;
};

// Reassembles the chunks of one RestoreState stream for a stage of
// `layout`. Each chunk is checked as it comes: one job; the same step,
// weight version and optimizer steps throughout; a tensor's chunks
// consecutive, starting at offset 0, each continuing where the last ended,
// within total_bytes; float32 data; a known name. Tensors of the stage's
// layers must have their checkpoint shape (total_bytes to match) and come
// once; their bytes never exceed the stage's whole state. Tensors of other
// layers are skipped, their data not kept. Errors are InvalidArgument
// naming the tensor. Not thread-safe (one stream's reads).
class StateAssembler {
 public:
  StateAssembler(std::string job_id, StateLayout layout);

  absl::Status Add(const v1::StateChunk& chunk);
  // After the last chunk: the stage's tensors (InvalidArgument when the
  // last tensor is incomplete). Completeness of the set is the restore's
  // check (ImportTrainingState).
  absl::StatusOr<TrainingState> Finish();

  const std::string& job_id() const { return job_id_; }

 private:
  // A chunk that begins a tensor (offset 0, a name not seen before).
  absl::Status Begin(const v1::StateChunk& chunk);
  // The tensor in progress ended: all of it must have come.
  absl::Status EndCurrent() const;
  absl::Status CheckScalars(const v1::StateChunk& chunk);

  const std::string job_id_;
  const StateLayout layout_;
  bool first_ = true;
  int64_t step_ = 0;
  int64_t weight_version_ = 0;
  TrainingState state_;
  std::set<std::string> seen_;  // the stage's tensors begun so far
  int64_t kept_bytes_ = 0;
  // The tensor in progress.
  std::string name_;
  int64_t next_offset_ = 0;
  int64_t total_bytes_ = 0;
  Tensor* target_ = nullptr;  // null: skipped (another layer's tensor)
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STATE_STREAM_H_
