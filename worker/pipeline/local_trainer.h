// LocalTrainer: the whole model in one process, one stage.
//
// It is the reference every pipeline schedule must match: each step reads
// the mini-batch of (seed, step), splits it into M micro-batches, runs
// forward and backward on each (accumulating gradients scaled by 1/N, N the
// mini-batch's loss rows), clips the global gradient norm and takes one
// optimizer step. This is GPipe's synchronous semantics, which equal plain
// mini-batch SGD up to float summation order.
//
// Not thread-safe: one thread drives a trainer.
#ifndef PIPETRAIN_WORKER_PIPELINE_LOCAL_TRAINER_H_
#define PIPETRAIN_WORKER_PIPELINE_LOCAL_TRAINER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "spec/training_spec.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "worker/nn/loss.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"

namespace pipetrain {

struct StepReport {
  int64_t step = 0;  // the step just taken (0-based)
  int64_t epoch = 0;
  double loss = 0.0;  // mean over the mini-batch
  double accuracy = 0.0;
  double grad_norm = 0.0;
  double seconds = 0.0;  // wall time of the step
};

struct EvalReport {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t samples = 0;
};

class LocalTrainer {
 public:
  // Opens the datasets, builds the model on `backend` (borrowed; must
  // outlive the trainer) and the optimizer.
  static absl::StatusOr<std::unique_ptr<LocalTrainer>> Create(
      const v1::TrainingSpec& spec, Backend* backend);

  // Takes optimizer step number step() and advances.
  absl::StatusOr<StepReport> Step();
  // Loss and accuracy on the eval split (all of it when max_samples is 0).
  absl::StatusOr<EvalReport> Evaluate(int64_t max_samples = 0);

  int64_t step() const { return step_; }
  // Steps the spec asks for (spec.steps, or epochs * steps per epoch).
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_per_epoch() const { return order_.steps_per_epoch(); }
  Model* model() { return model_.get(); }

 private:
  LocalTrainer(const v1::TrainingSpec& spec, Backend* backend,
               DatasetPair data);

  const v1::TrainingSpec spec_;
  Backend* const backend_;  // borrowed
  const DatasetPair data_;
  const SampleOrder order_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  SoftmaxCrossEntropyLoss loss_;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_LOCAL_TRAINER_H_
