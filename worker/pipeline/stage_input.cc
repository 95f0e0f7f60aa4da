#include "worker/pipeline/stage_input.h"

#include <numeric>

#include "common/status_macros.h"

namespace pipetrain {

StageInput::StageInput(DatasetPair data, const v1::TrainingSpec& spec,
                       const Shape& sample_shape)
    : data_(std::move(data)),
      sample_shape_(sample_shape),
      order_(std::make_unique<SampleOrder>(data_.train->size(),
                                           spec.batch_size(), spec.seed())) {}

StageInput::~StageInput() {
  // A read-ahead still running must finish before the datasets go.
  if (prefetch_.valid()) prefetch_.wait();
}

absl::StatusOr<std::unique_ptr<StageInput>> StageInput::Open(
    const v1::TrainingSpec& spec, const Shape& sample_shape) {
  ASSIGN_OR_RETURN(DatasetPair data, OpenDataset(spec.data(), spec.seed()));
  return std::unique_ptr<StageInput>(
      new StageInput(std::move(data), spec, sample_shape));
}

absl::StatusOr<Batch> StageInput::Gather(
    const Dataset& dataset, const std::vector<int64_t>& indices) const {
  ASSIGN_OR_RETURN(Batch batch, GatherBatch(dataset, indices));
  ASSIGN_OR_RETURN(batch.inputs, ShapeInputs(batch.inputs, sample_shape_));
  return batch;
}

absl::StatusOr<Batch> StageInput::TrainBatch(int64_t step, bool read_ahead) {
  auto gather = [this](int64_t s) {
    return Gather(*data_.train, order_->IndicesForStep(s));
  };
  absl::StatusOr<Batch> batch;
  if (prefetch_step_ == step && prefetch_.valid()) {
    batch = prefetch_.get();
  } else {
    if (prefetch_.valid()) prefetch_.wait();  // a read-ahead gone stale
    batch = gather(step);
  }
  prefetch_step_ = -1;
  if (read_ahead) {
    prefetch_ = std::async(std::launch::async, gather, step + 1);
    prefetch_step_ = step + 1;
  }
  return batch;
}

absl::StatusOr<Batch> StageInput::EvalBatch(RowRange rows) const {
  std::vector<int64_t> indices(static_cast<size_t>(rows.rows()));
  std::iota(indices.begin(), indices.end(), rows.begin);
  return Gather(*data_.eval, indices);
}

}  // namespace pipetrain
