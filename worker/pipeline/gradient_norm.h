// The pipeline-wide sum of squared gradient norms, for clipping the global
// gradient norm: partial sums flow up from the last stage to stage 0, and
// the total flows back down. Every stage of the job calls it once per
// clipped step, with the same step.
#ifndef PIPETRAIN_WORKER_PIPELINE_GRADIENT_NORM_H_
#define PIPETRAIN_WORKER_PIPELINE_GRADIENT_NORM_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/pipeline/stage_port.h"

namespace pipetrain {

// Adds this stage's `local` sum of squares to its neighbours' and returns
// the total over all stages. `first` / `last`: the stage's place in the
// pipeline. The time spent waiting for neighbours is added to
// *idle_seconds.
absl::StatusOr<double> AllReduceSumSquares(double local, int64_t step,
                                           bool first, bool last,
                                           StagePort* port,
                                           double* idle_seconds);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_GRADIENT_NORM_H_
