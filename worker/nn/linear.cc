#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/layers.h"

namespace pipetrain {

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(Backend* backend,
                                                       int64_t in, int64_t out,
                                                       bool bias,
                                                       uint64_t init_seed) {
  std::unique_ptr<Linear> layer(new Linear(backend, in, out));
  // U(-1/sqrt(in), 1/sqrt(in)), as PyTorch's default for nn.Linear weights.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  ASSIGN_OR_RETURN(layer->weight_, MakeParam(backend, "weight", {in, out},
                                             init_seed, 0, bound));
  layer->weight_.transposed = true;
  if (bias) {
    ASSIGN_OR_RETURN(
        Param b, MakeParam(backend, "bias", {out}, init_seed, 1, 0.0f, 0.0f));
    layer->bias_ = std::make_unique<Param>(std::move(b));
  }
  return layer;
}

std::vector<Param*> Linear::params() {
  std::vector<Param*> out = {&weight_};
  if (bias_ != nullptr) out.push_back(bias_.get());
  return out;
}

absl::StatusOr<const PackedOperand*> Linear::Packed(bool transposed) {
  if (!reuse_) return nullptr;
  PackedWeight& p = transposed ? packed_transposed_ : packed_;
  const float* source = weight_.value.f32();
  if (p.valid && p.version == weight_.version && p.source == source) {
    return &p.operand;
  }
  p.valid = false;
  // W is stored [in, out]: forward multiplies by it ([k=in, n=out]), dx by
  // its transpose ([k=out, n=in]).
  ASSIGN_OR_RETURN(
      const bool packed,
      transposed
          ? backend_->PackOperand(true, out_, in_, source, out_, &p.operand)
          : backend_->PackOperand(false, in_, out_, source, out_, &p.operand));
  if (!packed) {  // this backend has no packed path: stop asking
    reuse_ = false;
    return nullptr;
  }
  p.valid = true;
  p.version = weight_.version;
  p.source = source;
  return &p.operand;
}

absl::Status Linear::PrepareWeights(PackedCopies copies) {
  for (const bool transposed : {false, true}) {
    if (transposed && copies == PackedCopies::kForward) break;
    const PackedWeight& p = transposed ? packed_transposed_ : packed_;
    if (!p.operand.data.empty()) RETURN_IF_ERROR(Packed(transposed).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Linear::Forward(const Tensor& x, const ForwardOptions&,
                                       LayerContext* ctx) {
  if (x.rank() < 1 || x.dim(-1) != in_) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear expects last dimension ", in_, ", got shape ",
                     ShapeToString(x.shape())));
  }
  const int64_t rows = x.numel() / in_;
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  ASSIGN_OR_RETURN(Tensor y, backend_->AllocateUninitialized(out_shape));
  ASSIGN_OR_RETURN(const PackedOperand* packed, Packed(false));
  if (packed != nullptr) {
    RETURN_IF_ERROR(
        backend_->GemmPacked(rows, x.f32(), in_, *packed, y.f32(), out_));
  } else {
    RETURN_IF_ERROR(backend_->Gemm(false, false, rows, out_, in_, 1.0f, x.f32(),
                                   in_, weight_.value.f32(), out_, 0.0f,
                                   y.f32(), out_));
  }
  if (bias_ != nullptr) {
    RETURN_IF_ERROR(
        backend_->AddRowBroadcast(rows, out_, bias_->value.f32(), y.f32()));
  }
  if (ctx != nullptr) ctx->saved = {x};
  return y;
}

absl::Status Linear::CheckGradient(const Tensor& x, const Tensor& dy) const {
  const int64_t rows = x.numel() / in_;
  if (dy.numel() == rows * out_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "linear backward: gradient shape ", ShapeToString(dy.shape()),
      " does not match output rows ", rows, " x ", out_));
}

absl::StatusOr<bool> Linear::AccumulateWeightGrads(const Tensor& x,
                                                   const Tensor& dy,
                                                   int64_t first,
                                                   bool complete) {
  const int64_t rows = x.numel() / in_;
  // Rows run ahead: the first part of a sum split in two, which only a
  // fresh gradient and a backend that resumes sums exactly allow.
  if (!complete && first == 0 &&
      !(weight_.grad_fresh &&
        backend_->ResumesSums(true, false, in_, out_,
                              WeightGradQueue::kMaxRows))) {
    return false;
  }
  // dW (+)= x^T dy; db (+)= column sums of dy.
  if (first > 0 && first < rows) {
    RETURN_IF_ERROR(backend_->GemmResume(
        true, false, in_, out_, rows - first, x.f32() + first * in_, in_,
        dy.f32() + first * out_, out_, weight_.grad.f32(), out_));
  } else if (first == 0) {
    const float w_beta = weight_.grad_fresh ? 0.0f : 1.0f;
    RETURN_IF_ERROR(backend_->Gemm(true, false, in_, out_, rows, 1.0f, x.f32(),
                                   in_, dy.f32(), out_, w_beta,
                                   weight_.grad.f32(), out_));
  }
  weight_.grad_fresh = false;
  if (!complete) return true;
  if (bias_ != nullptr) {
    RETURN_IF_ERROR(backend_->ColumnSum(rows, out_, dy.f32(),
                                        bias_->grad_fresh ? 0.0f : 1.0f,
                                        bias_->grad.f32()));
    bias_->grad_fresh = false;
  }
  return true;
}

absl::Status Linear::WeightGrads(const Tensor& x, const Tensor& dy) {
  if (queue_ == nullptr) {
    return AccumulateWeightGrads(x, dy, /*first=*/0, /*complete=*/true)
        .status();
  }
  // Named by its weight: a caller flushes a layer's products by its
  // params() (WeightGradQueue::FlushFor).
  return queue_->Add(&weight_, in_, out_, x, dy,
                     [this](const Tensor& xs, const Tensor& dys, int64_t first,
                            bool complete) {
                       return AccumulateWeightGrads(xs, dys, first, complete);
                     });
}

absl::StatusOr<Tensor> Linear::InputGrad(const Tensor& x, const Tensor& dy) {
  const int64_t rows = x.numel() / in_;
  ASSIGN_OR_RETURN(Tensor dx, backend_->AllocateUninitialized(x.shape()));
  ASSIGN_OR_RETURN(const PackedOperand* packed, Packed(true));
  if (packed != nullptr) {
    RETURN_IF_ERROR(
        backend_->GemmPacked(rows, dy.f32(), out_, *packed, dx.f32(), in_));
    return dx;
  }
  RETURN_IF_ERROR(backend_->Gemm(false, true, rows, in_, out_, 1.0f, dy.f32(),
                                 out_, weight_.value.f32(), out_, 0.0f,
                                 dx.f32(), in_));
  return dx;
}

absl::StatusOr<Tensor> Linear::Backward(const Tensor& dy, const ForwardOptions&,
                                        LayerContext* ctx, bool need_dx) {
  const Tensor& x = ctx->saved.at(0);
  RETURN_IF_ERROR(CheckGradient(x, dy));
  RETURN_IF_ERROR(WeightGrads(x, dy));
  if (!need_dx) return Tensor();
  return InputGrad(x, dy);
}

absl::StatusOr<Tensor> Linear::BackwardInput(const Tensor& dy,
                                             const ForwardOptions&,
                                             LayerContext* ctx, bool need_dx) {
  const Tensor& x = ctx->saved.at(0);
  RETURN_IF_ERROR(CheckGradient(x, dy));
  Tensor dx;
  if (need_dx) {
    ASSIGN_OR_RETURN(dx, InputGrad(x, dy));
  }
  // W needs x and dy: saved = {x, dy}.
  ctx->saved.resize(2);
  ctx->saved[1] = dy;
  return dx;
}

absl::Status Linear::BackwardWeight(const ForwardOptions&, LayerContext* ctx) {
  if (ctx->saved.size() != 2) {
    return absl::FailedPreconditionError(
        "linear: BackwardWeight needs a BackwardInput on the same context");
  }
  RETURN_IF_ERROR(WeightGrads(ctx->saved[0], ctx->saved[1]));
  ctx->saved.clear();
  return absl::OkStatus();
}

}  // namespace pipetrain
