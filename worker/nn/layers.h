// The concrete layers. Shapes are [batch, ..., features]; layers that act on
// features treat every leading dimension as rows. See model.proto for the
// spec of each.
#ifndef PIPETRAIN_WORKER_NN_LAYERS_H_
#define PIPETRAIN_WORKER_NN_LAYERS_H_

#include <memory>

#include "worker/nn/layer.h"

namespace pipetrain {

// y = x W + b with W [in, out], b [out]. Split backward: B computes
// dx = dy W^T and keeps x and dy; W accumulates dW = x^T dy and db.
class Linear final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Linear>> Create(Backend* backend,
                                                        int64_t in, int64_t out,
                                                        bool bias,
                                                        uint64_t init_seed);
  std::string_view kind() const override { return "linear"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy,
                                       const ForwardOptions& options,
                                       LayerContext* ctx,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const ForwardOptions& options,
                              LayerContext* ctx) override;
  std::vector<Param*> params() override;
  // Keeps W (for forward) and W^T (for dx) packed.
  void ReuseWeights(bool reuse) override { reuse_ = reuse; }
  absl::Status PrepareWeights(PackedCopies copies) override;
  void DeferWeightGrads(WeightGradQueue* queue) override { queue_ = queue; }

 private:
  // A packed copy of the weight (or its transpose) and what it was made
  // from.
  struct PackedWeight {
    PackedOperand operand;
    bool valid = false;
    uint64_t version = 0;
    const float* source = nullptr;
  };
  Linear(Backend* backend, int64_t in, int64_t out)
      : backend_(backend), in_(in), out_(out) {}
  // The current packed weight (transposed for dx), packing it anew when the
  // weight changed; null when reuse is off or the backend has no packed
  // path.
  absl::StatusOr<const PackedOperand*> Packed(bool transposed);
  absl::Status CheckGradient(const Tensor& x, const Tensor& dy) const;
  // dW (+)= x^T dy over rows [first, rows) of x and dy (first > 0: carrying
  // on the sums of rows [0, first)); with `complete`, db (+)= column sums
  // of all of dy's rows. WeightGradQueue::Accumulate: false when asked to
  // run rows ahead that the backend could not carry on exactly, or into a
  // gradient that already holds a sum.
  absl::StatusOr<bool> AccumulateWeightGrads(const Tensor& x, const Tensor& dy,
                                             int64_t first, bool complete);
  // AccumulateWeightGrads now, or through the queue when one is set.
  absl::Status WeightGrads(const Tensor& x, const Tensor& dy);
  // dx = dy W^T.
  absl::StatusOr<Tensor> InputGrad(const Tensor& x, const Tensor& dy);
  Backend* const backend_;  // borrowed
  const int64_t in_;
  const int64_t out_;
  Param weight_;
  std::unique_ptr<Param> bias_;
  bool reuse_ = false;
  WeightGradQueue* queue_ = nullptr;  // borrowed; null: not deferred
  PackedWeight packed_;               // W: [in, out]
  PackedWeight packed_transposed_;    // W^T: [out, in]
};

class Relu final : public Layer {
 public:
  explicit Relu(Backend* backend) : backend_(backend) {}
  std::string_view kind() const override { return "relu"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;

 private:
  Backend* const backend_;  // borrowed
};

class Gelu final : public Layer {
 public:
  explicit Gelu(Backend* backend) : backend_(backend) {}
  std::string_view kind() const override { return "gelu"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;

 private:
  Backend* const backend_;  // borrowed
};

// Inverted dropout. Identity when not training.
class Dropout final : public Layer {
 public:
  // `mask_salt` distinguishes this layer's masks from other layers'.
  Dropout(Backend* backend, float rate, uint64_t mask_salt)
      : backend_(backend), rate_(rate), mask_salt_(mask_salt) {}
  std::string_view kind() const override { return "dropout"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;

 private:
  uint64_t MaskSeed(const ForwardOptions& options) const;
  Backend* const backend_;  // borrowed
  const float rate_;
  const uint64_t mask_salt_;
};

// [B, d1, d2, ...] -> [B, d1 * d2 * ...]; a view, no copy.
class Flatten final : public Layer {
 public:
  std::string_view kind() const override { return "flatten"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;
};

// Split backward: the backend's LayerNormBackward computes dx, dgamma and
// dbeta in one pass over the rows, so B (the inherited BackwardInput) does
// all of it and W is a no-op. Deferring the two [features] reductions would
// need a second kernel and keep x and the row statistics alive until W, for
// work that is a small fraction of the layer's cost.
class LayerNorm final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<LayerNorm>> Create(Backend* backend,
                                                           int64_t features,
                                                           float eps);
  std::string_view kind() const override { return "layer_norm"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;
  std::vector<Param*> params() override { return {&gamma_, &beta_}; }

 private:
  LayerNorm(Backend* backend, int64_t features, float eps)
      : backend_(backend), features_(features), eps_(eps) {}
  Backend* const backend_;  // borrowed
  const int64_t features_;
  const float eps_;
  Param gamma_;
  Param beta_;
};

// Token ids [B, T] -> token embedding + positional embedding [B, T, dim].
// The ids are not differentiable: Backward returns an empty dx. Split
// backward: B only keeps dy; W scatters it into the tables' gradients.
class Embedding final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Embedding>> Create(Backend* backend,
                                                           int64_t vocab,
                                                           int64_t dim,
                                                           int64_t max_seq_len,
                                                           uint64_t init_seed);
  std::string_view kind() const override { return "embedding"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy,
                                       const ForwardOptions& options,
                                       LayerContext* ctx,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const ForwardOptions& options,
                              LayerContext* ctx) override;
  std::vector<Param*> params() override { return {&tokens_, &positions_}; }

 private:
  Embedding(Backend* backend, int64_t vocab, int64_t dim, int64_t max_seq_len)
      : backend_(backend),
        vocab_(vocab),
        dim_(dim),
        max_seq_len_(max_seq_len) {}
  // Scatter-adds dy into the token table's gradient and sums it into the
  // positions' gradient.
  absl::Status AccumulateTableGrads(const Tensor& ids, const Tensor& dy);
  Backend* const backend_;  // borrowed
  const int64_t vocab_;
  const int64_t dim_;
  const int64_t max_seq_len_;
  Param tokens_;
  Param positions_;
};

// Causal multi-head self-attention on [B, T, dim] (no residual). Split
// backward: B runs the projections' input halves and the attention core
// (no parameters), W the projections' weight halves.
class CausalSelfAttention final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<CausalSelfAttention>> Create(
      Backend* backend, int64_t dim, int64_t heads, uint64_t init_seed);
  std::string_view kind() const override { return "attention"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy,
                                       const ForwardOptions& options,
                                       LayerContext* ctx,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const ForwardOptions& options,
                              LayerContext* ctx) override;
  std::vector<Param*> params() override;
  void ReuseWeights(bool reuse) override {
    qkv_->ReuseWeights(reuse);
    out_->ReuseWeights(reuse);
  }
  absl::Status PrepareWeights(PackedCopies copies) override;
  void DeferWeightGrads(WeightGradQueue* queue) override {
    qkv_->DeferWeightGrads(queue);
    out_->DeferWeightGrads(queue);
  }

 private:
  CausalSelfAttention(Backend* backend, int64_t dim, int64_t heads)
      : backend_(backend), dim_(dim), heads_(heads) {}
  // Backward (kFull) or BackwardInput (kInputOnly) up to dL/dx.
  absl::StatusOr<Tensor> InputBackward(BackwardMode mode, const Tensor& dy,
                                       const ForwardOptions& options,
                                       LayerContext* ctx, bool need_dx);
  Backend* const backend_;  // borrowed
  const int64_t dim_;
  const int64_t heads_;
  std::unique_ptr<Linear> qkv_;  // dim -> 3 * dim
  std::unique_ptr<Linear> out_;  // dim -> dim
};

// Pre-norm Transformer block: h = x + Attn(LN1(x)); y = h + MLP(LN2(h)).
// Split backward: B walks the sub-layers' input halves, W their weight
// halves (same order as the full backward: MLP branch, then attention).
class TransformerBlock final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<TransformerBlock>> Create(
      Backend* backend, int64_t dim, int64_t heads, int64_t mlp_dim,
      uint64_t seed, int64_t layer_index);
  std::string_view kind() const override { return "transformer_block"; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 LayerContext* ctx) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  LayerContext* ctx, bool need_dx) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy,
                                       const ForwardOptions& options,
                                       LayerContext* ctx,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const ForwardOptions& options,
                              LayerContext* ctx) override;
  std::vector<Param*> params() override;
  void ReuseWeights(bool reuse) override;
  absl::Status PrepareWeights(PackedCopies copies) override;
  void DeferWeightGrads(WeightGradQueue* queue) override;

 private:
  explicit TransformerBlock(Backend* backend) : backend_(backend) {}
  // Backward (kFull) or BackwardInput (kInputOnly) up to dL/dx.
  absl::StatusOr<Tensor> InputBackward(BackwardMode mode, const Tensor& dy,
                                       const ForwardOptions& options,
                                       LayerContext* ctx, bool need_dx);
  Backend* const backend_;  // borrowed
  // The residual branches, in order: ln1, attn | ln2, fc1, gelu, fc2.
  std::vector<std::unique_ptr<Layer>> attn_branch_;
  std::vector<std::unique_ptr<Layer>> mlp_branch_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_LAYERS_H_
