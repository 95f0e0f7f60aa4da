// Snapshots of a stage's training state for checkpoints, and restoring
// one.
//
// A snapshot is a host copy of the stage's parameters and optimizer state
// (worker/nn/model_state.h: named by global layer index, checkpoint layout)
// at a step boundary: "the boundary before step s" is after step s - 1's
// update, when the stage is about to run step s. The training thread takes
// the copy at the boundary (training then goes on); the copy is streamed
// out later (FetchSnapshot), so a slow reader never holds up a step.
// Cross-step schedules (1F1B-async, 2BW) keep micro-batches in flight
// across the boundary: their snapshot is the live weights and optimizer
// state; stashed versions and half-accumulated gradients are not saved
// (a resumed run starts with empty stashes).
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_SNAPSHOT_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_SNAPSHOT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/nn/model_state.h"
#include "worker/pipeline/stage_compute.h"

namespace pipetrain {

// A stage's state at the boundary before `step`.
struct StageStateSnapshot {
  int64_t step = 0;
  int64_t weight_version = 0;
  TrainingState state;
};

// Which boundaries a stage snapshots, and the copies it keeps: every
// boundary that is a multiple of TrainingSpec.checkpoint_every (past the
// stage's start step) and every boundary asked for; the two most recent
// copies are kept.
//
// Thread-safe. Request and Find come from control calls; AtBoundary from
// the thread that owns the stage's compute state, which runs the capture
// outside this class's lock (Request and Find never wait for a copy).
class StageSnapshots {
 public:
  // `every` <= 0: only boundaries asked for. Boundaries up to `start_step`
  // count as passed, except `start_step` itself, which the stage is at.
  StageSnapshots(int64_t every, int64_t start_step);

  // Asks for the boundary before `step`; returns `step`. FailedPrecondition
  // naming the next step the stage can still snapshot when it has already
  // begun `step` (and holds no copy of it); InvalidArgument for a negative
  // step; ResourceExhausted when too many requests wait.
  absl::StatusOr<int64_t> Request(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  using Capture = std::function<absl::StatusOr<StageStateSnapshot>()>;
  // The stage's weights are at the boundary before `step`: when it is
  // wanted and not yet held, runs `capture` and keeps the copy. `entering`:
  // the stage now begins `step` (later requests for it are refused).
  absl::Status AtBoundary(int64_t step, bool entering, const Capture& capture)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The copy of the boundary before `step`; NotFound when none is held
  // (never taken, not taken yet, or dropped for newer ones).
  absl::StatusOr<std::shared_ptr<const StageStateSnapshot>> Find(
      int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The steps of the copies held, oldest first.
  std::vector<int64_t> HeldSteps() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool Wanted(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int64_t every_;
  const int64_t start_step_;

  mutable absl::Mutex mu_;
  // The latest step the stage has begun.
  int64_t begun_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> requested_ ABSL_GUARDED_BY(mu_);
  // The boundary being copied now (-1: none).
  int64_t capturing_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<int64_t, std::shared_ptr<const StageStateSnapshot>> held_
      ABSL_GUARDED_BY(mu_);
};

// The names and checkpoint shapes of `compute`'s state (every chunk).
StateLayout StageStateLayout(const StageCompute& compute);

// Host copies of `compute`'s parameters and optimizer state, as the
// boundary before `step`. The caller owns the compute state.
absl::StatusOr<StageStateSnapshot> CaptureStageState(
    const StageCompute& compute, int64_t step);

// Loads `state` into `compute`'s model chunks and optimizer (see
// ImportTrainingState: every parameter of the stage must come; other
// layers' tensors are ignored; nothing changes on InvalidArgument). The
// weight version stays what the stage's start step makes it. The caller
// owns the compute state.
absl::Status RestoreStageState(const TrainingState& state,
                               StageCompute* compute);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_SNAPSHOT_H_
