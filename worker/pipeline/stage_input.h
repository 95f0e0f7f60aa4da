// StageInput: what stage 0 reads: each training step's mini-batch (in the
// job's deterministic order of (seed, step), read ahead on a helper thread
// while the previous step computes) and the held-out split for evaluation.
//
// Not thread-safe: owned by the stage's training thread. The read-ahead
// thread touches only the datasets and the order, which are immutable.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_INPUT_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_INPUT_H_

#include <cstdint>
#include <future>
#include <memory>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"
#include "worker/pipeline/micro_batch.h"

namespace pipetrain {

class StageInput {
 public:
  // Opens the spec's datasets; `sample_shape` is the model's input shape.
  static absl::StatusOr<std::unique_ptr<StageInput>> Open(
      const v1::TrainingSpec& spec, const Shape& sample_shape);
  ~StageInput();

  // The mini-batch of `step`, inputs shaped [B, sample_shape...]. With
  // `read_ahead` it starts reading step + 1's.
  absl::StatusOr<Batch> TrainBatch(int64_t step, bool read_ahead);
  // Rows `rows` of the held-out split, in order, shaped like TrainBatch's.
  absl::StatusOr<Batch> EvalBatch(RowRange rows) const;

  int64_t eval_size() const { return data_.eval->size(); }
  const SampleOrder& order() const { return *order_; }

 private:
  StageInput(DatasetPair data, const v1::TrainingSpec& spec,
             const Shape& sample_shape);
  absl::StatusOr<Batch> Gather(const Dataset& dataset,
                               const std::vector<int64_t>& indices) const;

  // Constant after construction.
  const DatasetPair data_;
  const Shape sample_shape_;
  std::unique_ptr<const SampleOrder> order_;

  std::future<absl::StatusOr<Batch>> prefetch_;
  int64_t prefetch_step_ = -1;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_INPUT_H_
