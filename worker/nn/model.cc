#include "worker/nn/model.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"

namespace pipetrain {
namespace {

absl::StatusOr<std::unique_ptr<Layer>> CreateLayer(const v1::LayerSpec& spec,
                                                   int index, Backend* backend,
                                                   uint64_t seed) {
  const uint64_t init_seed = LayerInitSeed(seed, index);
  switch (spec.kind_case()) {
    case v1::LayerSpec::kLinear:
      return Linear::Create(backend, spec.linear().in_features(),
                            spec.linear().out_features(),
                            !spec.linear().no_bias(), init_seed);
    case v1::LayerSpec::kRelu:
      return std::make_unique<Relu>(backend);
    case v1::LayerSpec::kGelu:
      return std::make_unique<Gelu>(backend);
    case v1::LayerSpec::kDropout:
      return std::make_unique<Dropout>(backend, spec.dropout().rate(),
                                       math::SplitMix64(index + 0xd70full));
    case v1::LayerSpec::kFlatten:
      return std::make_unique<Flatten>();
    case v1::LayerSpec::kLayerNorm: {
      const float eps =
          spec.layer_norm().eps() > 0 ? spec.layer_norm().eps() : 1e-5f;
      return LayerNorm::Create(backend, spec.layer_norm().features(), eps);
    }
    case v1::LayerSpec::kEmbedding:
      return Embedding::Create(backend, spec.embedding().vocab_size(),
                               spec.embedding().dim(),
                               spec.embedding().max_seq_len(), init_seed);
    case v1::LayerSpec::kAttention:
      return CausalSelfAttention::Create(backend, spec.attention().dim(),
                                         spec.attention().heads(), init_seed);
    case v1::LayerSpec::kTransformerBlock: {
      const auto& t = spec.transformer_block();
      const int64_t mlp = t.mlp_dim() > 0 ? t.mlp_dim() : 4 * t.dim();
      return TransformerBlock::Create(backend, t.dim(), t.heads(), mlp, seed,
                                      index);
    }
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("layers[", index, "].kind: no layer kind set"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const v1::ModelSpec& spec,
                                                    int begin, int end,
                                                    Backend* backend,
                                                    uint64_t seed) {
  ASSIGN_OR_RETURN(std::vector<Shape> shapes, ValidateModelSpec(spec));
  if (begin < 0 || end > spec.layers_size() || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer range [", begin, ", ", end, ") is empty or outside the model's ",
        spec.layers_size(), " layers"));
  }
  std::unique_ptr<Model> model(new Model(backend, begin, end));
  model->input_shape_ = shapes[begin];
  model->output_shape_ = shapes[end];
  for (int i = begin; i < end; ++i) {
    ASSIGN_OR_RETURN(auto layer, CreateLayer(spec.layers(i), i, backend, seed));
    for (Param* p : layer->params()) {
      p->name = absl::StrCat("layers.", i, ".", p->name);
      model->params_.push_back(p);
    }
    model->layers_.push_back(std::move(layer));
  }
  return model;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const Param* p : params_) n += p->value.numel();
  return n;
}

absl::StatusOr<Tensor> Model::Forward(const Tensor& x,
                                      const ForwardOptions& options,
                                      std::vector<LayerContext>* contexts) {
  if (contexts != nullptr) contexts->resize(layers_.size());
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    ASSIGN_OR_RETURN(
        h, layers_[i]->Forward(
               h, options, contexts == nullptr ? nullptr : &(*contexts)[i]));
  }
  return h;
}

absl::StatusOr<Tensor> Model::Backward(const Tensor& dy,
                                       const ForwardOptions& options,
                                       std::vector<LayerContext>* contexts,
                                       bool need_dx) {
  return RunBackwardPass(BackwardMode::kFull, dy, options, contexts, need_dx);
}

absl::StatusOr<Tensor> Model::BackwardInput(const Tensor& dy,
                                            const ForwardOptions& options,
                                            std::vector<LayerContext>* contexts,
                                            bool need_dx) {
  return RunBackwardPass(BackwardMode::kInputOnly, dy, options, contexts,
                         need_dx);
}

absl::Status Model::BackwardWeight(const ForwardOptions& options,
                                   std::vector<LayerContext>* contexts) {
  return RunBackwardPass(BackwardMode::kWeightOnly, Tensor(), options, contexts,
                         false)
      .status();
}

absl::StatusOr<Tensor> Model::RunBackwardPass(
    BackwardMode mode, const Tensor& dy, const ForwardOptions& options,
    std::vector<LayerContext>* contexts, bool need_dx) {
  if (contexts->size() != layers_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("backward needs the contexts of a forward over ",
                     layers_.size(), " layers, got ", contexts->size()));
  }
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    ASSIGN_OR_RETURN(g, RunBackward(layers_[i].get(), mode, g, options,
                                    &(*contexts)[i], i > 0 || need_dx));
  }
  return g;
}

absl::Status Model::PrepareWeights() {
  for (auto& layer : layers_) {
    RETURN_IF_ERROR(layer->PrepareWeights(PackedCopies::kAll));
  }
  return absl::OkStatus();
}

void Model::DeferWeightGrads(bool defer) {
  if (defer && weight_grads_ == nullptr) {
    weight_grads_ = std::make_unique<WeightGradQueue>(backend_);
  }
  for (auto& layer : layers_) {
    layer->DeferWeightGrads(defer ? weight_grads_.get() : nullptr);
  }
  if (!defer) weight_grads_.reset();
}

absl::Status Model::FlushWeightGrads() {
  if (weight_grads_ == nullptr) return absl::OkStatus();
  return weight_grads_->Flush();
}

absl::Status Model::FlushWeightGradsFor(const std::vector<Param*>& params) {
  if (weight_grads_ == nullptr) return absl::OkStatus();
  return weight_grads_->FlushFor(params);
}

absl::StatusOr<bool> Model::RunWeightGradsAhead(int64_t min_rows) {
  if (weight_grads_ == nullptr) return false;
  return weight_grads_->RunAhead(min_rows);
}

void Model::DiscardWeightGrads() {
  if (weight_grads_ != nullptr) weight_grads_->Discard();
}

absl::StatusOr<std::vector<Tensor>> Model::ParamsToHost() const {
  std::vector<Tensor> out;
  for (const Param* p : params_) {
    ASSIGN_OR_RETURN(Tensor t, ToHost(backend_, p->value));
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status Model::LoadParams(const std::vector<Tensor>& host) {
  if (host.size() != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", params_.size(), " parameter tensors, got ", host.size()));
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i].shape() != params_[i]->value.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          params_[i]->name, ": shape ", ShapeToString(host[i].shape()),
          " does not match ", ShapeToString(params_[i]->value.shape())));
    }
    RETURN_IF_ERROR(backend_->CopyFromHost(host[i].f32(), host[i].numel(),
                                           params_[i]->value.f32()));
    ++params_[i]->version;
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
