// An evaluation pass: the held-out split forward-only through a job's
// stages at their current weights, the last stage computing loss and
// accuracy. It reads exactly what LocalTrainer::Evaluate reads (the first
// samples of the split, in order, in batches of the job's batch size), cut
// into micro-batches of the training micro-batch's rows, and sends them
// down as evaluation activations (MessageKind::kEvalActivation); no
// gradient comes back. The last stage reads the same rows' labels itself.
// Interleaved stages run each micro-batch through their chunks in
// virtual-stage order, as training does.
//
// Every stage of the job runs the same pass, numbered alike on all of them
// (`pass` keys its messages apart from other passes'). Stage 0 knows the
// pass's length and marks its last micro-batch; the others run until that
// one has passed through (the last stage, which plans the same rows from
// its labels, checks that they agree). The pass has no flow control of its own:
// stage 0 runs ahead of slower stages by as many micro-batches as their
// mailboxes hold, at most the pass's.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_EVALUATION_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_EVALUATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/nn/loss.h"
#include "worker/pipeline/stage_compute.h"

namespace pipetrain {

struct EvalStats {
  LossStats loss;       // summed over the loss rows (last stage only)
  int64_t samples = 0;  // samples evaluated (last stage only)
};

// Runs this stage's part of evaluation pass `pass` over the first
// `max_samples` samples of the held-out split (all of them when 0). The
// last stage returns the pass's loss and accuracy sums, the others empty
// stats. The compute is borrowed for the call (its owner's compute lock
// held). FailedPrecondition on stage 0 when there is nothing to evaluate.
absl::StatusOr<EvalStats> RunEvaluationPass(StageCompute* compute, int64_t pass,
                                            int64_t max_samples);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_EVALUATION_H_
