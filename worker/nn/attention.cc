// Causal multi-head self-attention and the pre-norm Transformer block.
//
// Layout: qkv is [B, T, 3 * dim] with q, k, v side by side in each row, and
// head h at columns [h * dh, (h + 1) * dh) of each. Per sequence b, one
// strided-batched GEMM over the heads reads them in place (row stride
// 3 * dim, head stride dh), so no transposes are materialized; the
// attention output lands directly in [B, T, dim] order.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/layers.h"

namespace pipetrain {

absl::StatusOr<std::unique_ptr<CausalSelfAttention>>
CausalSelfAttention::Create(Backend* backend, int64_t dim, int64_t heads,
                            uint64_t init_seed) {
  std::unique_ptr<CausalSelfAttention> layer(
      new CausalSelfAttention(backend, dim, heads));
  ASSIGN_OR_RETURN(layer->qkv_,
                   Linear::Create(backend, dim, 3 * dim, true, init_seed));
  ASSIGN_OR_RETURN(layer->out_, Linear::Create(backend, dim, dim, true,
                                               init_seed ^ 0x0a770a77ull));
  // Checkpoint names: layers.{i}.qkv.weight, layers.{i}.out.bias, ...
  NameChildParams(layer->qkv_.get(), "qkv");
  NameChildParams(layer->out_.get(), "out");
  return layer;
}

std::vector<Param*> CausalSelfAttention::params() {
  std::vector<Param*> out = qkv_->params();
  for (Param* p : out_->params()) out.push_back(p);
  return out;
}

absl::StatusOr<Tensor> CausalSelfAttention::Forward(
    const Tensor& x, const ForwardOptions& options, LayerContext* ctx) {
  if (x.rank() != 3 || x.dim(2) != dim_) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention expects [batch, T, ", dim_, "], got ",
                     ShapeToString(x.shape())));
  }
  const int64_t batch = x.dim(0), t = x.dim(1), d = dim_, h = heads_;
  const int64_t dh = d / h;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  LayerContext qkv_ctx;
  ASSIGN_OR_RETURN(Tensor qkv, qkv_->Forward(x, options, &qkv_ctx));
  ASSIGN_OR_RETURN(Tensor probs,
                   backend_->AllocateUninitialized({batch, h, t, t}));
  ASSIGN_OR_RETURN(Tensor attn, backend_->AllocateUninitialized({batch, t, d}));
  for (int64_t b = 0; b < batch; ++b) {
    const float* q = qkv.f32() + b * t * 3 * d;
    float* s = probs.f32() + b * h * t * t;
    RETURN_IF_ERROR(backend_->GemmStridedBatched(false, true, t, t, dh, scale,
                                                 q, 3 * d, dh, q + d, 3 * d, dh,
                                                 0.0f, s, t, t * t, h));
  }
  RETURN_IF_ERROR(
      backend_->SoftmaxForward(batch * h * t, t, t, probs.f32(), probs.f32()));
  for (int64_t b = 0; b < batch; ++b) {
    const float* v = qkv.f32() + b * t * 3 * d + 2 * d;
    const float* p = probs.f32() + b * h * t * t;
    RETURN_IF_ERROR(backend_->GemmStridedBatched(
        false, false, t, dh, t, 1.0f, p, t, t * t, v, 3 * d, dh, 0.0f,
        attn.f32() + b * t * d, d, dh, h));
  }
  LayerContext out_ctx;
  ASSIGN_OR_RETURN(Tensor y, out_->Forward(attn, options, &out_ctx));
  if (ctx != nullptr) {
    ctx->saved = {qkv, probs};
    ctx->children.clear();
    ctx->children.push_back(std::move(qkv_ctx));
    ctx->children.push_back(std::move(out_ctx));
  }
  return y;
}

absl::StatusOr<Tensor> CausalSelfAttention::Backward(
    const Tensor& dy, const ForwardOptions& options, LayerContext* ctx,
    bool need_dx) {
  return InputBackward(BackwardMode::kFull, dy, options, ctx, need_dx);
}

absl::StatusOr<Tensor> CausalSelfAttention::BackwardInput(
    const Tensor& dy, const ForwardOptions& options, LayerContext* ctx,
    bool need_dx) {
  ASSIGN_OR_RETURN(Tensor dx, InputBackward(BackwardMode::kInputOnly, dy,
                                            options, ctx, need_dx));
  // W needs only the projections' contexts, not qkv and the probabilities.
  ctx->saved.clear();
  return dx;
}

absl::Status CausalSelfAttention::BackwardWeight(const ForwardOptions& options,
                                                 LayerContext* ctx) {
  if (ctx->children.size() != 2) {
    return absl::FailedPreconditionError(
        "attention: BackwardWeight needs a BackwardInput on the same context");
  }
  // The full backward's order: the output projection, then qkv.
  RETURN_IF_ERROR(out_->BackwardWeight(options, &ctx->children[1]));
  return qkv_->BackwardWeight(options, &ctx->children[0]);
}

absl::StatusOr<Tensor> CausalSelfAttention::InputBackward(
    BackwardMode mode, const Tensor& dy, const ForwardOptions& options,
    LayerContext* ctx, bool need_dx) {
  const Tensor& qkv = ctx->saved.at(0);
  const Tensor& probs = ctx->saved.at(1);
  const int64_t batch = qkv.dim(0), t = qkv.dim(1), d = dim_, h = heads_;
  const int64_t dh = d / h;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  ASSIGN_OR_RETURN(Tensor dattn, RunBackward(out_.get(), mode, dy, options,
                                             &ctx->children.at(1), true));
  ASSIGN_OR_RETURN(Tensor dprobs,
                   backend_->AllocateUninitialized({batch, h, t, t}));
  ASSIGN_OR_RETURN(Tensor dqkv, backend_->AllocateUninitialized(qkv.shape()));
  for (int64_t b = 0; b < batch; ++b) {
    const float* p = probs.f32() + b * h * t * t;
    const float* v = qkv.f32() + b * t * 3 * d + 2 * d;
    const float* dout = dattn.f32() + b * t * d;
    float* dp = dprobs.f32() + b * h * t * t;
    float* dv = dqkv.f32() + b * t * 3 * d + 2 * d;
    // dP = dO V^T; dV = P^T dO.
    RETURN_IF_ERROR(backend_->GemmStridedBatched(false, true, t, t, dh, 1.0f,
                                                 dout, d, dh, v, 3 * d, dh,
                                                 0.0f, dp, t, t * t, h));
    RETURN_IF_ERROR(backend_->GemmStridedBatched(true, false, t, dh, t, 1.0f, p,
                                                 t, t * t, dout, d, dh, 0.0f,
                                                 dv, 3 * d, dh, h));
  }
  // dS = softmax backward (masked entries have P = 0, so dS = 0 there).
  RETURN_IF_ERROR(backend_->SoftmaxBackward(batch * h * t, t, probs.f32(),
                                            dprobs.f32(), dprobs.f32()));
  for (int64_t b = 0; b < batch; ++b) {
    const float* ds = dprobs.f32() + b * h * t * t;
    const float* q = qkv.f32() + b * t * 3 * d;
    float* dq = dqkv.f32() + b * t * 3 * d;
    // dQ = scale * dS K; dK = scale * dS^T Q.
    RETURN_IF_ERROR(backend_->GemmStridedBatched(false, false, t, dh, t, scale,
                                                 ds, t, t * t, q + d, 3 * d, dh,
                                                 0.0f, dq, 3 * d, dh, h));
    RETURN_IF_ERROR(backend_->GemmStridedBatched(true, false, t, dh, t, scale,
                                                 ds, t, t * t, q, 3 * d, dh,
                                                 0.0f, dq + d, 3 * d, dh, h));
  }
  return RunBackward(qkv_.get(), mode, dqkv, options, &ctx->children.at(0),
                     need_dx);
}

absl::StatusOr<std::unique_ptr<TransformerBlock>> TransformerBlock::Create(
    Backend* backend, int64_t dim, int64_t heads, int64_t mlp_dim,
    uint64_t seed, int64_t layer_index) {
  std::unique_ptr<TransformerBlock> block(new TransformerBlock(backend));
  ASSIGN_OR_RETURN(auto ln1, LayerNorm::Create(backend, dim, 1e-5f));
  ASSIGN_OR_RETURN(
      auto attn, CausalSelfAttention::Create(
                     backend, dim, heads, LayerInitSeed(seed, layer_index, 1)));
  ASSIGN_OR_RETURN(auto ln2, LayerNorm::Create(backend, dim, 1e-5f));
  ASSIGN_OR_RETURN(auto fc1,
                   Linear::Create(backend, dim, mlp_dim, true,
                                  LayerInitSeed(seed, layer_index, 2)));
  ASSIGN_OR_RETURN(auto fc2,
                   Linear::Create(backend, mlp_dim, dim, true,
                                  LayerInitSeed(seed, layer_index, 3)));
  // Checkpoint names: layers.{i}.ln1.gamma, layers.{i}.attn.qkv.weight,
  // layers.{i}.fc2.bias, ...
  NameChildParams(ln1.get(), "ln1");
  NameChildParams(attn.get(), "attn");
  NameChildParams(ln2.get(), "ln2");
  NameChildParams(fc1.get(), "fc1");
  NameChildParams(fc2.get(), "fc2");
  block->attn_branch_.push_back(std::move(ln1));
  block->attn_branch_.push_back(std::move(attn));
  block->mlp_branch_.push_back(std::move(ln2));
  block->mlp_branch_.push_back(std::move(fc1));
  block->mlp_branch_.push_back(std::make_unique<Gelu>(backend));
  block->mlp_branch_.push_back(std::move(fc2));
  return block;
}

std::vector<Param*> TransformerBlock::params() {
  std::vector<Param*> out;
  for (auto* branch : {&attn_branch_, &mlp_branch_}) {
    for (auto& layer : *branch) {
      for (Param* p : layer->params()) out.push_back(p);
    }
  }
  return out;
}

void TransformerBlock::ReuseWeights(bool reuse) {
  for (auto* branch : {&attn_branch_, &mlp_branch_}) {
    for (auto& layer : *branch) layer->ReuseWeights(reuse);
  }
}

void TransformerBlock::DeferWeightGrads(WeightGradQueue* queue) {
  for (auto* branch : {&attn_branch_, &mlp_branch_}) {
    for (auto& layer : *branch) layer->DeferWeightGrads(queue);
  }
}

absl::Status TransformerBlock::PrepareWeights(PackedCopies copies) {
  for (auto* branch : {&attn_branch_, &mlp_branch_}) {
    for (auto& layer : *branch) RETURN_IF_ERROR(layer->PrepareWeights(copies));
  }
  return absl::OkStatus();
}

absl::Status CausalSelfAttention::PrepareWeights(PackedCopies copies) {
  RETURN_IF_ERROR(qkv_->PrepareWeights(copies));
  return out_->PrepareWeights(copies);
}

namespace {

// x + branch(x), with the branch's contexts appended to `contexts`.
absl::StatusOr<Tensor> ResidualForward(
    Backend* backend, const std::vector<std::unique_ptr<Layer>>& branch,
    const Tensor& x, const ForwardOptions& options,
    std::vector<LayerContext>* contexts) {
  Tensor h = x;
  for (const auto& layer : branch) {
    LayerContext* ctx = nullptr;
    if (contexts != nullptr) ctx = &contexts->emplace_back();
    ASSIGN_OR_RETURN(h, layer->Forward(h, options, ctx));
  }
  RETURN_IF_ERROR(backend->Add(x.numel(), x.f32(), h.f32(), h.f32()));
  return h;
}

// Gradient through x + branch(x): dy + branch^T(dy), running the `mode`
// (kFull or kInputOnly) part of each sub-layer's backward.
absl::StatusOr<Tensor> ResidualBackward(
    Backend* backend, const std::vector<std::unique_ptr<Layer>>& branch,
    BackwardMode mode, const Tensor& dy, const ForwardOptions& options,
    LayerContext* contexts, bool need_dx) {
  Tensor g = dy;
  for (size_t i = branch.size(); i-- > 0;) {
    ASSIGN_OR_RETURN(
        g, RunBackward(branch[i].get(), mode, g, options, &contexts[i], true));
  }
  if (!need_dx) return Tensor();
  RETURN_IF_ERROR(backend->Add(dy.numel(), dy.f32(), g.f32(), g.f32()));
  return g;
}

}  // namespace

absl::StatusOr<Tensor> TransformerBlock::Forward(const Tensor& x,
                                                 const ForwardOptions& options,
                                                 LayerContext* ctx) {
  std::vector<LayerContext>* children = nullptr;
  if (ctx != nullptr) {
    ctx->children.clear();
    children = &ctx->children;
  }
  ASSIGN_OR_RETURN(
      Tensor h, ResidualForward(backend_, attn_branch_, x, options, children));
  return ResidualForward(backend_, mlp_branch_, h, options, children);
}

absl::StatusOr<Tensor> TransformerBlock::Backward(const Tensor& dy,
                                                  const ForwardOptions& options,
                                                  LayerContext* ctx,
                                                  bool need_dx) {
  return InputBackward(BackwardMode::kFull, dy, options, ctx, need_dx);
}

absl::StatusOr<Tensor> TransformerBlock::BackwardInput(
    const Tensor& dy, const ForwardOptions& options, LayerContext* ctx,
    bool need_dx) {
  return InputBackward(BackwardMode::kInputOnly, dy, options, ctx, need_dx);
}

absl::StatusOr<Tensor> TransformerBlock::InputBackward(
    BackwardMode mode, const Tensor& dy, const ForwardOptions& options,
    LayerContext* ctx, bool need_dx) {
  LayerContext* contexts = ctx->children.data();
  ASSIGN_OR_RETURN(Tensor dh,
                   ResidualBackward(backend_, mlp_branch_, mode, dy, options,
                                    contexts + attn_branch_.size(), true));
  return ResidualBackward(backend_, attn_branch_, mode, dh, options, contexts,
                          need_dx);
}

absl::Status TransformerBlock::BackwardWeight(const ForwardOptions& options,
                                              LayerContext* ctx) {
  const size_t n = attn_branch_.size() + mlp_branch_.size();
  if (ctx->children.size() != n) {
    return absl::FailedPreconditionError(
        "transformer_block: BackwardWeight needs a BackwardInput on the same "
        "context");
  }
  // The full backward's order: the MLP branch, then attention, each from
  // its last sub-layer.
  for (size_t i = n; i-- > 0;) {
    Layer* layer = i < attn_branch_.size()
                       ? attn_branch_[i].get()
                       : mlp_branch_[i - attn_branch_.size()].get();
    RETURN_IF_ERROR(layer->BackwardWeight(options, &ctx->children[i]));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
