// StageData: what a stage reads of its job's data. Stage 0 reads the inputs
// of each mini-batch, the last stage their labels (a one-stage pipeline
// both; middle stages nothing and have no StageData). Both follow the job's
// deterministic order of (seed, step) over a split of the same size, so
// they agree on which rows form each micro-batch without the labels
// travelling down the pipeline; activations carry only the size of the
// split stage 0 reads, which the last stage checks against its labels
// (CheckUpstreamSize). A stage opens only the files of its part where the
// format keeps them apart (OpenDataset's DataParts).
//
// Training batches are read ahead on a helper thread while the previous
// step computes; evaluation reads rows of the held-out split.
//
// Not thread-safe: owned by the stage's training thread. The read-ahead
// thread touches only the datasets and the order, which are immutable.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_DATA_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_DATA_H_

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"
#include "worker/pipeline/micro_batch.h"

namespace pipetrain {

class StageData {
 public:
  // Opens the `parts` (at least one) of the spec's datasets;
  // `sample_shape` is the model's input shape (what inputs are shaped to).
  static absl::StatusOr<std::unique_ptr<StageData>> Open(
      const v1::TrainingSpec& spec, DataParts parts, const Shape& sample_shape);
  ~StageData();

  // The mini-batch of `step`: inputs shaped [B, sample_shape...] when the
  // stage reads inputs, labels when it reads labels (the other empty). With
  // `read_ahead` it starts reading step + 1's.
  absl::StatusOr<Batch> TrainBatch(int64_t step, bool read_ahead);
  // Rows `rows` of the held-out split, in order, shaped like TrainBatch's.
  absl::StatusOr<Batch> EvalBatch(RowRange rows) const;

  DataParts parts() const { return parts_; }
  int64_t train_size() const { return data_.train->size(); }
  int64_t eval_size() const { return data_.eval->size(); }
  const SampleOrder& order() const { return *order_; }

  // Whether stage 0's split (the held-out one when `eval`) held `upstream`
  // samples, as many as this stage's: InvalidArgument naming both sides'
  // files otherwise (the two would not order the same samples).
  absl::Status CheckUpstreamSize(int64_t upstream, bool eval) const;

 private:
  StageData(DatasetPair data, const v1::TrainingSpec& spec, DataParts parts,
            const Shape& sample_shape);
  absl::StatusOr<Batch> Gather(const Dataset& dataset,
                               const std::vector<int64_t>& indices) const;

  // Constant after construction.
  const DatasetPair data_;
  const v1::DatasetSpec spec_;
  const DataParts parts_;
  const Shape sample_shape_;
  std::unique_ptr<const SampleOrder> order_;

  std::future<absl::StatusOr<Batch>> prefetch_;
  int64_t prefetch_step_ = -1;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_DATA_H_
