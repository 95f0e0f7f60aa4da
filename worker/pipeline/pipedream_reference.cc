#include "worker/pipeline/pipedream_reference.h"

#include <algorithm>
#include <memory>

#include "common/status_macros.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/data/dataset.h"
#include "worker/nn/loss.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"
#include "worker/pipeline/micro_batch.h"

namespace pipetrain {
namespace {

// One stage: its layers, its optimizer, and every version of its weights
// (versions[v] = after v updates).
struct RefStage {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<std::vector<Tensor>> versions;
};

class Reference {
 public:
  Reference(const v1::TrainingSpec& spec, const PipeDreamRun& run)
      : spec_(spec),
        run_(run),
        backend_(CreateCpuBackend(1)),
        loss_(backend_.get()) {}

  absl::Status Build();
  absl::StatusOr<PipeDreamResult> Train();

 private:
  int k() const { return static_cast<int>(stages_.size()); }
  int64_t m() const { return std::max<int64_t>(1, spec_.micro_batches()); }
  int64_t SegmentStart(int64_t step) const;
  // The version stage s runs micro-batch m of `step` with.
  int64_t VersionFor(int s, int64_t step, int64_t mb) const;
  // Forward and backward of one micro-batch through every stage, each with
  // its version; gradients accumulate into the stages' parameters.
  absl::Status RunMicroBatch(int64_t step, int64_t mb, const Batch& batch,
                             float scale, LossStats* stats);
  // Applies each stage's gradients to its newest weights.
  absl::Status Update();
  std::vector<Tensor> NewestWeights() const;

  const v1::TrainingSpec spec_;
  const PipeDreamRun run_;
  std::unique_ptr<Backend> backend_;
  SoftmaxCrossEntropyLoss loss_;
  std::vector<RefStage> stages_;
  DatasetPair data_;
};

absl::Status Reference::Build() {
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), run_.cuts.begin(), run_.cuts.end());
  bounds.push_back(spec_.model().layers_size());
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    RefStage stage;
    ASSIGN_OR_RETURN(stage.model,
                     Model::Build(spec_.model(), bounds[s], bounds[s + 1],
                                  backend_.get(), spec_.seed()));
    ASSIGN_OR_RETURN(stage.optimizer,
                     Optimizer::Create(spec_.optimizer(), backend_.get()));
    ASSIGN_OR_RETURN(std::vector<Tensor> initial, stage.model->ParamsToHost());
    stage.versions.push_back(std::move(initial));
    stages_.push_back(std::move(stage));
  }
  ASSIGN_OR_RETURN(data_, OpenDataset(spec_.data(), spec_.seed()));
  return absl::OkStatus();
}

int64_t Reference::SegmentStart(int64_t step) const {
  int64_t start = 0;
  for (int64_t s : run_.segment_starts) {
    if (s <= step) start = std::max(start, s);
  }
  return start;
}

int64_t Reference::VersionFor(int s, int64_t step, int64_t mb) const {
  const int64_t t0 = SegmentStart(step);
  if (run_.schedule == v1::SCHEDULE_2BW) return std::max(t0, step - 1);
  const int64_t g = step * m() + mb;
  // The forward of g follows the backward of g - w, w = the stage's
  // warm-up (stage 0's under vertical sync).
  const int64_t depth = 1 + int64_t{run_.extra_warmup};
  const int64_t warmup = (run_.vertical_sync ? k() - 1 : k() - 1 - s) * depth;
  return std::max(t0 * m(), g - warmup);
}

absl::Status Reference::RunMicroBatch(int64_t step, int64_t mb,
                                      const Batch& batch, float scale,
                                      LossStats* stats) {
  const int64_t rows = spec_.batch_size() / m();
  ForwardOptions options;
  options.dropout_seed = MicroBatchSeed(spec_.seed(), step, mb);
  ASSIGN_OR_RETURN(Tensor x,
                   batch.inputs.SliceRows(mb * rows, (mb + 1) * rows));
  ASSIGN_OR_RETURN(Tensor labels,
                   batch.labels.SliceRows(mb * rows, (mb + 1) * rows));
  std::vector<std::vector<LayerContext>> contexts(stages_.size());
  for (int s = 0; s < k(); ++s) {
    RefStage& stage = stages_[s];
    RETURN_IF_ERROR(
        stage.model->LoadParams(stage.versions.at(VersionFor(s, step, mb))));
    ASSIGN_OR_RETURN(x, stage.model->Forward(x, options, &contexts[s]));
  }
  LayerContext loss_ctx;
  ASSIGN_OR_RETURN(LossStats s, loss_.Forward(x, labels, &loss_ctx));
  stats->Add(s);
  ASSIGN_OR_RETURN(Tensor dy, loss_.Backward(scale, &loss_ctx));
  // Each stage still holds the version its forward used.
  for (int s = k() - 1; s >= 0; --s) {
    ASSIGN_OR_RETURN(dy, stages_[s].model->Backward(dy, options, &contexts[s],
                                                    /*need_dx=*/s > 0));
  }
  return absl::OkStatus();
}

absl::Status Reference::Update() {
  for (RefStage& stage : stages_) {
    RETURN_IF_ERROR(stage.model->LoadParams(stage.versions.back()));
    RETURN_IF_ERROR(stage.optimizer->Step(stage.model->params()));
    ASSIGN_OR_RETURN(std::vector<Tensor> next, stage.model->ParamsToHost());
    stage.versions.push_back(std::move(next));
  }
  return absl::OkStatus();
}

std::vector<Tensor> Reference::NewestWeights() const {
  std::vector<Tensor> out;
  for (const RefStage& stage : stages_) {
    out.insert(out.end(), stage.versions.back().begin(),
               stage.versions.back().end());
  }
  return out;
}

absl::StatusOr<PipeDreamResult> Reference::Train() {
  const SampleOrder order(data_.train->size(), spec_.batch_size(),
                          spec_.seed());
  const bool two_bw = run_.schedule == v1::SCHEDULE_2BW;
  PipeDreamResult result;
  for (int64_t step = 0; step < spec_.steps(); ++step) {
    ASSIGN_OR_RETURN(Batch batch,
                     GatherBatch(*data_.train, order.IndicesForStep(step)));
    ASSIGN_OR_RETURN(
        batch.inputs,
        ShapeInputs(batch.inputs, stages_[0].model->input_shape()));
    // The loss is the mean over the update's rows: the micro-batch's
    // (async) or the mini-batch's (2BW).
    const float scale =
        1.0f / static_cast<float>(two_bw ? batch.labels.numel()
                                         : batch.labels.numel() / m());
    LossStats stats;
    for (RefStage& stage : stages_) ZeroGrads(stage.model->params());
    for (int64_t mb = 0; mb < m(); ++mb) {
      RETURN_IF_ERROR(RunMicroBatch(step, mb, batch, scale, &stats));
      if (!two_bw) RETURN_IF_ERROR(Update());
    }
    if (two_bw) RETURN_IF_ERROR(Update());
    result.losses.push_back(stats.mean_loss());
    result.weights_after_step.push_back(NewestWeights());
  }
  return result;
}

}  // namespace

absl::StatusOr<PipeDreamResult> RunPipeDreamReference(
    const v1::TrainingSpec& spec, const PipeDreamRun& run) {
  if (run.schedule != v1::SCHEDULE_ASYNC_1F1B &&
      run.schedule != v1::SCHEDULE_2BW) {
    return absl::InvalidArgumentError("the reference runs 1F1B-async or 2BW");
  }
  Reference reference(spec, run);
  RETURN_IF_ERROR(reference.Build());
  return reference.Train();
}

}  // namespace pipetrain
