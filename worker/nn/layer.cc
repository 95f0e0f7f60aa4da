#include "worker/nn/layer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"
#include "worker/compute/half.h"

namespace pipetrain {

absl::StatusOr<Tensor> Layer::BackwardInput(const Tensor& dy,
                                            const ForwardOptions& options,
                                            LayerContext* ctx, bool need_dx) {
  ASSIGN_OR_RETURN(Tensor dx, Backward(dy, options, ctx, need_dx));
  // Nothing is left for the weight pass: free the activations now, which
  // is what lets a zero-bubble stage hold less between B and W.
  ctx->saved.clear();
  ctx->children.clear();
  return dx;
}

absl::Status Layer::BackwardWeight(const ForwardOptions&, LayerContext*) {
  return absl::OkStatus();
}

absl::StatusOr<Tensor> RunBackward(Layer* layer, BackwardMode mode,
                                   const Tensor& dy,
                                   const ForwardOptions& options,
                                   LayerContext* ctx, bool need_dx) {
  switch (mode) {
    case BackwardMode::kFull:
      return layer->Backward(dy, options, ctx, need_dx);
    case BackwardMode::kInputOnly:
      return layer->BackwardInput(dy, options, ctx, need_dx);
    case BackwardMode::kWeightOnly:
      RETURN_IF_ERROR(layer->BackwardWeight(options, ctx));
      return Tensor();
  }
  return absl::InvalidArgumentError("unknown backward mode");
}

void ZeroGrads(const std::vector<Param*>& params) {
  for (Param* p : params) p->grad_fresh = true;
}

absl::StatusOr<uint64_t> ParamsChecksum(Backend* backend,
                                        const std::vector<Param*>& params) {
  uint64_t hash = 0x9e3779b97f4a7c15ull;
  std::vector<float> host;
  for (const Param* p : params) {
    const float* values = p->value.f32();
    if (p->value.device() != Device::kCpu) {
      host.resize(static_cast<size_t>(p->value.numel()));
      RETURN_IF_ERROR(
          backend->CopyToHost(values, p->value.numel(), host.data()));
      values = host.data();
    }
    // Two floats per 64-bit word, each word mixed in: any changed bit or
    // swapped position changes the result.
    const int64_t n = p->value.numel();
    for (int64_t i = 0; i < n; i += 2) {
      uint64_t word = FloatBits(values[i]);
      if (i + 1 < n) word |= uint64_t{FloatBits(values[i + 1])} << 32;
      hash = math::SplitMix64(hash ^ word);
    }
  }
  return hash;
}

void NameChildParams(Layer* layer, std::string_view child) {
  for (Param* p : layer->params()) p->name = std::string(child) + "." + p->name;
}

uint64_t LayerInitSeed(uint64_t seed, int64_t layer_index, int64_t child) {
  return math::SplitMix64(math::SplitMix64(seed ^ 0x5eed5eedull) +
                          static_cast<uint64_t>(layer_index) * 1000003ull +
                          static_cast<uint64_t>(child));
}

absl::StatusOr<Param> MakeParam(Backend* backend, std::string name,
                                const Shape& shape, uint64_t init_seed,
                                int slot, float bound, float constant) {
  ASSIGN_OR_RETURN(Tensor host, Tensor::TryHost(shape));
  float* v = host.f32();
  const uint64_t stream = math::SplitMix64(init_seed + 7919ull * (slot + 1));
  for (int64_t i = 0; i < host.numel(); ++i) {
    v[i] = bound == 0.0f
               ? constant
               : (2.0f * math::UniformAt(stream, static_cast<uint64_t>(i)) -
                  1.0f) *
                     bound;
  }
  Param p;
  p.name = std::move(name);
  ASSIGN_OR_RETURN(p.value, ToDevice(backend, host));
  ASSIGN_OR_RETURN(p.grad, backend->Allocate(shape));
  return p;
}

}  // namespace pipetrain
