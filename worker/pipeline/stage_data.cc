#include "worker/pipeline/stage_data.h"

#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/fashion_mnist.h"

namespace pipetrain {
namespace {

// Where one part of a split comes from, for errors.
std::string PartSource(const v1::DatasetSpec& data, bool eval, bool labels) {
  const char* split = eval ? "eval" : "train";
  switch (data.source_case()) {
    case v1::DatasetSpec::kNumpy: {
      const v1::NumpySource& n = data.numpy();
      const std::string& path =
          labels ? (eval ? n.eval_labels() : n.train_labels())
                 : (eval ? n.eval_features() : n.train_features());
      return absl::StrCat("data.numpy.", split,
                          labels ? "_labels " : "_features ", path);
    }
    case v1::DatasetSpec::kFashionMnist:
      return absl::StrCat(
          "the Fashion-MNIST ",
          eval ? kFashionMnistEvalPrefix : kFashionMnistTrainPrefix,
          labels ? " labels" : " images", " file");
    default:
      break;
  }
  return absl::StrCat("the ", split, " split of data");
}

}  // namespace

StageData::StageData(DatasetPair data, const v1::TrainingSpec& spec,
                     DataParts parts, const Shape& sample_shape)
    : data_(std::move(data)),
      spec_(spec.data()),
      parts_(parts),
      sample_shape_(sample_shape),
      order_(std::make_unique<SampleOrder>(data_.train->size(),
                                           spec.batch_size(), spec.seed())) {}

StageData::~StageData() {
  // A read-ahead still running must finish before the datasets go.
  if (prefetch_.valid()) prefetch_.wait();
}

absl::StatusOr<std::unique_ptr<StageData>> StageData::Open(
    const v1::TrainingSpec& spec, DataParts parts, const Shape& sample_shape) {
  ASSIGN_OR_RETURN(DatasetPair data,
                   OpenDataset(spec.data(), spec.seed(), parts));
  return std::unique_ptr<StageData>(
      new StageData(std::move(data), spec, parts, sample_shape));
}

absl::StatusOr<Batch> StageData::Gather(
    const Dataset& dataset, const std::vector<int64_t>& indices) const {
  Batch batch;
  if (parts_.inputs && parts_.labels) {
    ASSIGN_OR_RETURN(batch, GatherBatch(dataset, indices));
  } else if (parts_.inputs) {
    ASSIGN_OR_RETURN(batch.inputs, GatherInputs(dataset, indices));
  } else {
    ASSIGN_OR_RETURN(batch.labels, GatherLabels(dataset, indices));
  }
  if (parts_.inputs) {
    ASSIGN_OR_RETURN(batch.inputs, ShapeInputs(batch.inputs, sample_shape_));
  }
  return batch;
}

absl::StatusOr<Batch> StageData::TrainBatch(int64_t step, bool read_ahead) {
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

absl::StatusOr<Batch> StageData::EvalBatch(RowRange rows) const {
  std::vector<int64_t> indices(static_cast<size_t>(rows.rows()));
  std::iota(indices.begin(), indices.end(), rows.begin);
  return Gather(*data_.eval, indices);
}

absl::Status StageData::CheckUpstreamSize(int64_t upstream, bool eval) const {
  const int64_t own = eval ? eval_size() : train_size();
  if (upstream == own) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "stage 0 reads ", upstream, " samples from ",
      PartSource(spec_, eval, /*labels=*/false), " but this stage's ",
      PartSource(spec_, eval, /*labels=*/true), " holds ", own,
      ": inputs and labels must hold the same samples in the same order"));
}

}  // namespace pipetrain
