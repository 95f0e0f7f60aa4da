// What a stage holds while it runs a step: per micro-batch tensors, per
// step bookkeeping and counters. Plain data, owned by the stage's training
// thread.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_STATE_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_STATE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/compute/tensor.h"
#include "worker/nn/layer.h"
#include "worker/nn/loss.h"

namespace pipetrain {

// What a stage holds for one micro-batch of one model chunk during a step.
struct MicroBatch {
  Tensor input;   // device: the stage's input (kept for backward / remat)
  Tensor output;  // device: the stage's output until sent or lossed
  // The size of the training split stage 0 reads (StageMessage::samples),
  // passed on down to the last stage, which checks its labels against it.
  int64_t data_samples = 0;
  std::vector<LayerContext> contexts;
  Tensor grad_output;  // device: dL/d(output)
  Tensor grad_input;   // device: dL/d(input), until sent
  // The weight version its forward used (and its backward must use).
  int64_t version = 0;
};

// Cross-step schedules: how stage 0 decided a step ends. The decision
// travels with the step's activations (StageMessage::value) so every stage
// drains at the same step.
enum class StepEnd {
  kContinue = 0,  // the pipeline runs on into the next step
  kEndRun = 1,    // drain (cool-down) and stop: the run's last step
  // Drain for an evaluation pass after this step (TrainingSpec.eval_every),
  // then warm up again: the run goes on.
  kDrainForEvaluation = 2,
};

// What a stage holds for one step's micro-batches, from the step's first
// instruction until its last backward (which, in the cross-step schedules,
// may run in the next step's stream).
struct StepState {
  int64_t step = 0;
  // Per chunk, per micro-batch: micro[chunk * M + mb].
  std::vector<MicroBatch> micro;
  int pending = 0;   // micro-batches whose backward has not finished
  int forwards = 0;  // forwards run (each micro-batch of each chunk once)
  Tensor inputs;     // stage 0: the step's whole mini-batch's inputs (host)
  Tensor labels;     // last stage: its labels (host), read by the stage
  // Stage 0 and the last stage: whether to read the next step's mini-batch
  // ahead.
  bool read_ahead = false;
  LossStats loss;
  // 2BW: the weight version every micro-batch of the step uses.
  int64_t version = 0;
  StepEnd end = StepEnd::kContinue;
};

// What a stage measured over one step's stream.
struct StepCounters {
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  double idle_seconds = 0.0;
  double optimizer_seconds = 0.0;
  int64_t held_bytes = 0;  // carried across steps (cross-step schedules)
  int64_t peak_bytes = 0;
  void Hold(int64_t bytes) {
    held_bytes += bytes;
    peak_bytes = std::max(peak_bytes, held_bytes);
  }
};

// The weights a forward or backward ran with, recorded where it ran.
struct WeightUse {
  bool recorded = false;
  int64_t version = 0;
  // ParamsChecksum of the chunk's parameters at the moment of use; 0 unless
  // the stage checksums weights (StageOptions::checksum_weights).
  uint64_t checksum = 0;
};

// Sum of the bytes of every tensor a forward context keeps alive.
int64_t ContextBytes(const std::vector<LayerContext>& contexts);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_STATE_H_
