// Test-only: an in-process reference for the cross-step schedules, written
// from their definitions, not from the executor. It runs a pipeline's
// stages as separate models in one process, one micro-batch at a time,
// sequentially, and keeps every weight version each stage produced, so a
// micro-batch simply runs with the versions the schedule says it sees:
//
//  - PipeDream's asynchronous 1F1B: micro-batch g (= step * M + m) runs on
//    stage s with the version after max(g0, g - w_s) updates (its forward
//    follows the backward of g - w_s, w_s = (K - 1 - s) * (1 + extra
//    warm-up) its warm-up, and every backward is followed by an update;
//    g0 = the first micro-batch of the run segment), forward and backward
//    alike (weight stashing); with vertical sync every stage uses stage 0's
//    version, max(g0, g - w_0). Each micro-batch is its own update (loss mean
//    over its rows), applied on each stage to that stage's newest weights.
//  - PipeDream-2BW: every micro-batch of step t runs with the version after
//    max(t0, t - 1) updates (t0 = the run segment's first step); the step's
//    M gradients accumulate and are applied once to the newest weights.
//
// A run segment ends where the pipeline drains (a pause, or an evaluation
// point); the next one warms up again.
#ifndef PIPETRAIN_WORKER_PIPELINE_PIPEDREAM_REFERENCE_H_
#define PIPETRAIN_WORKER_PIPELINE_PIPEDREAM_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/stage.pb.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

struct PipeDreamRun {
  v1::ScheduleKindProto schedule = v1::SCHEDULE_ASYNC_1F1B;  // or 2BW
  bool vertical_sync = false;
  // ScheduleParams::extra_warmup.
  int extra_warmup = 0;
  std::vector<int> cuts;  // layer indices where stages begin, after 0
  // Steps where a run segment begins after 0 (drained pipeline).
  std::vector<int64_t> segment_starts;
};

struct PipeDreamResult {
  std::vector<double> losses;  // mean loss of each step
  // After each step: every stage's newest weights, in stage order.
  std::vector<std::vector<Tensor>> weights_after_step;
};

// Trains spec.steps() steps of `spec` as `run` says.
absl::StatusOr<PipeDreamResult> RunPipeDreamReference(
    const v1::TrainingSpec& spec, const PipeDreamRun& run);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_PIPEDREAM_REFERENCE_H_
