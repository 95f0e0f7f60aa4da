// Layers without a matrix product: activations, dropout, flatten, layer norm.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"

namespace pipetrain {

absl::StatusOr<Tensor> Relu::Forward(const Tensor& x, const ForwardOptions&,
                                     LayerContext* ctx) {
  ASSIGN_OR_RETURN(Tensor y, backend_->AllocateUninitialized(x.shape()));
  RETURN_IF_ERROR(backend_->ReluForward(x.numel(), x.f32(), y.f32()));
  if (ctx != nullptr) ctx->saved = {y};
  return y;
}

absl::StatusOr<Tensor> Relu::Backward(const Tensor& dy, const ForwardOptions&,
                                      LayerContext* ctx, bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor& y = ctx->saved.at(0);
  ASSIGN_OR_RETURN(Tensor dx, backend_->AllocateUninitialized(y.shape()));
  RETURN_IF_ERROR(
      backend_->ReluBackward(y.numel(), y.f32(), dy.f32(), dx.f32()));
  return dx;
}

absl::StatusOr<Tensor> Gelu::Forward(const Tensor& x, const ForwardOptions&,
                                     LayerContext* ctx) {
  ASSIGN_OR_RETURN(Tensor y, backend_->AllocateUninitialized(x.shape()));
  RETURN_IF_ERROR(backend_->GeluForward(x.numel(), x.f32(), y.f32()));
  if (ctx != nullptr) ctx->saved = {x};
  return y;
}

absl::StatusOr<Tensor> Gelu::Backward(const Tensor& dy, const ForwardOptions&,
                                      LayerContext* ctx, bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor& x = ctx->saved.at(0);
  ASSIGN_OR_RETURN(Tensor dx, backend_->AllocateUninitialized(x.shape()));
  RETURN_IF_ERROR(
      backend_->GeluBackward(x.numel(), x.f32(), dy.f32(), dx.f32()));
  return dx;
}

uint64_t Dropout::MaskSeed(const ForwardOptions& options) const {
  return math::SplitMix64(options.dropout_seed ^ mask_salt_);
}

absl::StatusOr<Tensor> Dropout::Forward(const Tensor& x,
                                        const ForwardOptions& options,
                                        LayerContext*) {
  if (!options.training || rate_ == 0.0f) return x;
  ASSIGN_OR_RETURN(Tensor y, backend_->AllocateUninitialized(x.shape()));
  RETURN_IF_ERROR(
      backend_->Dropout(x.numel(), x.f32(), rate_, MaskSeed(options), y.f32()));
  return y;
}

absl::StatusOr<Tensor> Dropout::Backward(const Tensor& dy,
                                         const ForwardOptions& options,
                                         LayerContext*, bool need_dx) {
  if (!need_dx) return Tensor();
  if (!options.training || rate_ == 0.0f) return dy;
  // The mask is a pure function of the seed: recompute it instead of saving.
  ASSIGN_OR_RETURN(Tensor dx, backend_->AllocateUninitialized(dy.shape()));
  RETURN_IF_ERROR(backend_->Dropout(dy.numel(), dy.f32(), rate_,
                                    MaskSeed(options), dx.f32()));
  return dx;
}

absl::StatusOr<Tensor> Flatten::Forward(const Tensor& x, const ForwardOptions&,
                                        LayerContext* ctx) {
  if (x.rank() < 1) return absl::InvalidArgumentError("flatten needs a batch");
  if (ctx != nullptr) ctx->input_shape = x.shape();
  const int64_t batch = x.dim(0);
  return x.Reshaped({batch, batch == 0 ? 0 : x.numel() / batch});
}

absl::StatusOr<Tensor> Flatten::Backward(const Tensor& dy,
                                         const ForwardOptions&,
                                         LayerContext* ctx, bool need_dx) {
  if (!need_dx) return Tensor();
  return dy.Reshaped(ctx->input_shape);
}

absl::StatusOr<std::unique_ptr<LayerNorm>> LayerNorm::Create(Backend* backend,
                                                             int64_t features,
                                                             float eps) {
  std::unique_ptr<LayerNorm> layer(new LayerNorm(backend, features, eps));
  ASSIGN_OR_RETURN(layer->gamma_,
                   MakeParam(backend, "gamma", {features}, 0, 0, 0.0f, 1.0f));
  ASSIGN_OR_RETURN(layer->beta_,
                   MakeParam(backend, "beta", {features}, 0, 1, 0.0f, 0.0f));
  return layer;
}

absl::StatusOr<Tensor> LayerNorm::Forward(const Tensor& x,
                                          const ForwardOptions&,
                                          LayerContext* ctx) {
  if (x.rank() < 1 || x.dim(-1) != features_) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_norm expects last dimension ", features_,
                     ", got shape ", ShapeToString(x.shape())));
  }
  const int64_t rows = x.numel() / features_;
  ASSIGN_OR_RETURN(Tensor y, backend_->AllocateUninitialized(x.shape()));
  ASSIGN_OR_RETURN(Tensor stats, backend_->AllocateUninitialized({2, rows}));
  RETURN_IF_ERROR(backend_->LayerNormForward(
      rows, features_, x.f32(), gamma_.value.f32(), beta_.value.f32(), eps_,
      y.f32(), stats.f32(), stats.f32() + rows));
  if (ctx != nullptr) ctx->saved = {x, stats};
  return y;
}

absl::StatusOr<Tensor> LayerNorm::Backward(const Tensor& dy,
                                           const ForwardOptions&,
                                           LayerContext* ctx, bool need_dx) {
  const Tensor& x = ctx->saved.at(0);
  const Tensor& stats = ctx->saved.at(1);
  const int64_t rows = x.numel() / features_;
  for (Param* p : {&gamma_, &beta_}) {
    if (p->grad_fresh) {
      RETURN_IF_ERROR(backend_->Fill(p->grad.f32(), features_, 0.0f));
      p->grad_fresh = false;
    }
  }
  // The backend computes dx with the parameter gradients; without need_dx
  // the result is simply dropped.
  ASSIGN_OR_RETURN(Tensor dx, backend_->AllocateUninitialized(x.shape()));
  RETURN_IF_ERROR(backend_->LayerNormBackward(
      rows, features_, x.f32(), gamma_.value.f32(), stats.f32(),
      stats.f32() + rows, dy.f32(), dx.f32(), gamma_.grad.f32(),
      beta_.grad.f32()));
  if (!need_dx) return Tensor();
  return dx;
}

}  // namespace pipetrain
