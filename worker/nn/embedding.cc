#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/layers.h"

namespace pipetrain {

absl::StatusOr<std::unique_ptr<Embedding>> Embedding::Create(
    Backend* backend, int64_t vocab, int64_t dim, int64_t max_seq_len,
    uint64_t init_seed) {
  std::unique_ptr<Embedding> layer(
      new Embedding(backend, vocab, dim, max_seq_len));
  // Uniform with standard deviation 0.02 (GPT-2's initializer scale).
  const float bound = 0.02f * std::sqrt(3.0f);
  ASSIGN_OR_RETURN(layer->tokens_, MakeParam(backend, "tokens", {vocab, dim},
                                             init_seed, 0, bound));
  ASSIGN_OR_RETURN(
      layer->positions_,
      MakeParam(backend, "positions", {max_seq_len, dim}, init_seed, 1, bound));
  return layer;
}

absl::StatusOr<Tensor> Embedding::Forward(const Tensor& x,
                                          const ForwardOptions&,
                                          LayerContext* ctx) {
  if (x.rank() != 2 || x.dim(1) > max_seq_len_ || x.dim(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding expects token ids [batch, T] with 1 <= T <= ", max_seq_len_,
        ", got shape ", ShapeToString(x.shape())));
  }
  const int64_t batch = x.dim(0);
  const int64_t t = x.dim(1);
  ASSIGN_OR_RETURN(Tensor y, backend_->AllocateUninitialized({batch, t, dim_}));
  RETURN_IF_ERROR(backend_->EmbeddingForward(batch * t, dim_, vocab_, x.f32(),
                                             tokens_.value.f32(), y.f32()));
  RETURN_IF_ERROR(backend_->AddRowBroadcast(batch, t * dim_,
                                            positions_.value.f32(), y.f32()));
  if (ctx != nullptr) ctx->saved = {x};
  return y;
}

absl::Status Embedding::AccumulateTableGrads(const Tensor& ids,
                                             const Tensor& dy) {
  const int64_t batch = ids.dim(0);
  const int64_t t = ids.dim(1);
  if (dy.numel() != batch * t * dim_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding backward: gradient shape ", ShapeToString(dy.shape()),
        " does not match [", batch, ", ", t, ", ", dim_, "]"));
  }
  for (Param* p : {&tokens_, &positions_}) {
    if (p->grad_fresh) {
      RETURN_IF_ERROR(backend_->Fill(p->grad.f32(), p->grad.numel(), 0.0f));
      p->grad_fresh = false;
    }
  }
  RETURN_IF_ERROR(backend_->EmbeddingBackward(batch * t, dim_, ids.f32(),
                                              dy.f32(), tokens_.grad.f32()));
  return backend_->ColumnSum(batch, t * dim_, dy.f32(), 1.0f,
                             positions_.grad.f32());
}

absl::StatusOr<Tensor> Embedding::Backward(const Tensor& dy,
                                           const ForwardOptions&,
                                           LayerContext* ctx, bool) {
  RETURN_IF_ERROR(AccumulateTableGrads(ctx->saved.at(0), dy));
  return Tensor();
}

absl::StatusOr<Tensor> Embedding::BackwardInput(const Tensor& dy,
                                                const ForwardOptions&,
                                                LayerContext* ctx, bool) {
  // No dx (ids are not differentiable); W needs the ids and dy.
  ctx->saved.resize(2);
  ctx->saved[1] = dy;
  return Tensor();
}

absl::Status Embedding::BackwardWeight(const ForwardOptions&,
                                       LayerContext* ctx) {
  if (ctx->saved.size() != 2) {
    return absl::FailedPreconditionError(
        "embedding: BackwardWeight needs a BackwardInput on the same context");
  }
  RETURN_IF_ERROR(AccumulateTableGrads(ctx->saved[0], ctx->saved[1]));
  ctx->saved.clear();
  return absl::OkStatus();
}

}  // namespace pipetrain
