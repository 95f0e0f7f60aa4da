#include "worker/pipeline/local_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/schedule.h"
#include "spec/training_spec.h"
#include "worker/pipeline/micro_batch.h"

namespace pipetrain {

LocalTrainer::LocalTrainer(const v1::TrainingSpec& spec, Backend* backend,
                           DatasetPair data)
    : spec_(spec),
      backend_(backend),
      data_(std::move(data)),
      order_(data_.train->size(), spec.batch_size(), spec.seed()),
      loss_(backend) {}

absl::StatusOr<std::unique_ptr<LocalTrainer>> LocalTrainer::Create(
    const v1::TrainingSpec& spec, Backend* backend) {
  RETURN_IF_ERROR(ValidateTrainingSpec(spec));
  ASSIGN_OR_RETURN(DatasetPair data, OpenDataset(spec.data(), spec.seed()));
  if (data.train->size() < spec.batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size ", spec.batch_size(), " exceeds the ",
                     data.train->size(), " training samples"));
  }
  const Shape sample(spec.model().input_shape().begin(),
                     spec.model().input_shape().end());
  if (NumElements(sample) != NumElements(data.train->sample_shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.input_shape ", ShapeToString(sample),
                     " does not fit the dataset's samples ",
                     ShapeToString(data.train->sample_shape())));
  }
  std::unique_ptr<LocalTrainer> t(
      new LocalTrainer(spec, backend, std::move(data)));
  ASSIGN_OR_RETURN(t->model_,
                   Model::Build(spec.model(), 0, spec.model().layers_size(),
                                backend, spec.seed()));
  // Micro-batches reuse the weights unchanged within a step and hold their
  // weight-gradient products, as a synchronous stage does
  // (StageCompute::Build), so that the two sum the gradients in the same
  // order.
  const int m = static_cast<int>(spec.micro_batches());
  t->model_->ReuseWeights(ReusesWeights(ScheduleKind::kGPipe, m));
  t->model_->DeferWeightGrads(
      DefersWeightGrads(ScheduleKind::kGPipe, m, spec.rematerialize()));
  ASSIGN_OR_RETURN(t->optimizer_, Optimizer::Create(spec.optimizer(), backend));
  t->total_steps_ = spec.steps() > 0
                        ? spec.steps()
                        : spec.epochs() * t->order_.steps_per_epoch();
  return t;
}

absl::StatusOr<StepReport> LocalTrainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> indices = order_.IndicesForStep(step_);
  ASSIGN_OR_RETURN(Batch batch, GatherBatch(*data_.train, indices));
  ASSIGN_OR_RETURN(Tensor inputs,
                   ShapeInputs(batch.inputs, model_->input_shape()));
  const int64_t m = std::max<int64_t>(1, spec_.micro_batches());
  const int64_t rows_per_micro = spec_.batch_size() / m;
  // The loss is the mean over every label of the mini-batch.
  const float scale = 1.0f / static_cast<float>(batch.labels.numel());

  model_->DiscardWeightGrads();  // an earlier step that failed midway
  ZeroGrads(model_->params());
  LossStats stats;
  std::vector<LayerContext> contexts;
  for (int64_t mb = 0; mb < m; ++mb) {
    ForwardOptions options;
    options.training = true;
    options.dropout_seed = MicroBatchSeed(spec_.seed(), step_, mb);
    const int64_t begin = mb * rows_per_micro;
    ASSIGN_OR_RETURN(Tensor x_host,
                     inputs.SliceRows(begin, begin + rows_per_micro));
    ASSIGN_OR_RETURN(Tensor y_host,
                     batch.labels.SliceRows(begin, begin + rows_per_micro));
    ASSIGN_OR_RETURN(Tensor x, ToDevice(backend_, x_host));
    ASSIGN_OR_RETURN(Tensor labels, ToDevice(backend_, y_host));
    ASSIGN_OR_RETURN(Tensor logits, model_->Forward(x, options, &contexts));
    LayerContext loss_ctx;
    ASSIGN_OR_RETURN(LossStats s, loss_.Forward(logits, labels, &loss_ctx));
    stats.Add(s);
    ASSIGN_OR_RETURN(Tensor dlogits, loss_.Backward(scale, &loss_ctx));
    RETURN_IF_ERROR(
        model_->Backward(dlogits, options, &contexts, false).status());
  }
  RETURN_IF_ERROR(model_->FlushWeightGrads());
  ASSIGN_OR_RETURN(double sum_squares,
                   GradSumSquares(backend_, model_->params()));
  RETURN_IF_ERROR(optimizer_->Step(
      model_->params(), ClipScale(sum_squares, optimizer_->clip_grad_norm())));

  StepReport report;
  report.step = step_;
  report.epoch = order_.EpochOfStep(step_);
  report.loss = stats.mean_loss();
  report.accuracy = stats.accuracy();
  report.grad_norm = std::sqrt(sum_squares);
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ++step_;
  return report;
}

absl::StatusOr<EvalReport> LocalTrainer::Evaluate(int64_t max_samples) {
  const Dataset& eval = *data_.eval;
  LossStats stats;
  ForwardOptions options;
  options.training = false;
  const std::vector<RowRange> batches =
      EvalBatches(eval.size(), max_samples, spec_.batch_size());
  for (const RowRange& rows : batches) {
    std::vector<int64_t> indices(rows.rows());
    std::iota(indices.begin(), indices.end(), rows.begin);
    ASSIGN_OR_RETURN(Batch batch, GatherBatch(eval, indices));
    ASSIGN_OR_RETURN(Tensor x_host,
                     ShapeInputs(batch.inputs, model_->input_shape()));
    ASSIGN_OR_RETURN(Tensor x, ToDevice(backend_, x_host));
    ASSIGN_OR_RETURN(Tensor labels, ToDevice(backend_, batch.labels));
    ASSIGN_OR_RETURN(Tensor logits, model_->Forward(x, options, nullptr));
    ASSIGN_OR_RETURN(LossStats s, loss_.Forward(logits, labels, nullptr));
    stats.Add(s);
  }
  EvalReport report;
  report.loss = stats.mean_loss();
  report.accuracy = stats.accuracy();
  report.samples = batches.empty() ? 0 : batches.back().end;
  return report;
}

}  // namespace pipetrain
