#include "worker/nn/loss.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<LossStats> SoftmaxCrossEntropyLoss::Forward(const Tensor& logits,
                                                           const Tensor& labels,
                                                           LayerContext* ctx) {
  if (logits.rank() < 1 || logits.dim(-1) < 1) {
    return absl::InvalidArgumentError("loss: logits need a class dimension");
  }
  const int64_t classes = logits.dim(-1);
  const int64_t rows = logits.numel() / classes;
  if (labels.numel() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss: ", labels.numel(), " labels ", ShapeToString(labels.shape()),
        " for ", rows, " rows of logits ", ShapeToString(logits.shape())));
  }
  ASSIGN_OR_RETURN(Tensor probs,
                   backend_->AllocateUninitialized(logits.shape()));
  ASSIGN_OR_RETURN(Tensor stats, backend_->AllocateUninitialized({2, rows}));
  RETURN_IF_ERROR(backend_->SoftmaxCrossEntropy(
      rows, classes, logits.f32(), labels.f32(), probs.f32(), stats.f32(),
      stats.f32() + rows));
  ASSIGN_OR_RETURN(Tensor host, ToHost(backend_, stats));
  LossStats out;
  out.rows = rows;
  const float* h = host.f32();
  for (int64_t r = 0; r < rows; ++r) {
    out.loss_sum += h[r];
    out.correct += h[rows + r];
  }
  if (ctx != nullptr) ctx->saved = {probs, labels};
  return out;
}

absl::StatusOr<Tensor> SoftmaxCrossEntropyLoss::Backward(float scale,
                                                         LayerContext* ctx) {
  const Tensor& probs = ctx->saved.at(0);
  const Tensor& labels = ctx->saved.at(1);
  const int64_t classes = probs.dim(-1);
  const int64_t rows = probs.numel() / classes;
  ASSIGN_OR_RETURN(Tensor dlogits,
                   backend_->AllocateUninitialized(probs.shape()));
  RETURN_IF_ERROR(backend_->SoftmaxCrossEntropyBackward(
      rows, classes, probs.f32(), labels.f32(), scale, dlogits.f32()));
  return dlogits;
}

}  // namespace pipetrain
