#include "worker/nn/model.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"

namespace pipetrain {
namespace {

absl::Status FieldError(int index, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("layers[", index, "].", field, ": ", what));
}

absl::Status RequirePositive(int index, const std::string& field,
                             int64_t value) {
  if (value > 0) return absl::OkStatus();
  return FieldError(index, field,
                    value == 0 ? "missing or zero (must be > 0)"
                               : absl::StrCat(value, " must be > 0"));
}

absl::Status RequireLastDim(int index, const std::string& field, int64_t value,
                            const Shape& in) {
  RETURN_IF_ERROR(RequirePositive(index, field, value));
  if (in.empty() || in.back() != value) {
    return FieldError(index, field,
                      absl::StrCat(value,
                                   " does not match the input's last "
                                   "dimension (input shape ",
                                   ShapeToString(in), ")"));
  }
  return absl::OkStatus();
}

// The per-sample output shape of layer `index` given its input shape.
absl::StatusOr<Shape> OutputShape(const v1::LayerSpec& layer, int index,
                                  const Shape& in) {
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear: {
      const auto& l = layer.linear();
      RETURN_IF_ERROR(
          RequireLastDim(index, "linear.in_features", l.in_features(), in));
      RETURN_IF_ERROR(
          RequirePositive(index, "linear.out_features", l.out_features()));
      Shape out = in;
      out.back() = l.out_features();
      return out;
    }
    case v1::LayerSpec::kRelu:
    case v1::LayerSpec::kGelu:
      return in;
    case v1::LayerSpec::kDropout: {
      const float r = layer.dropout().rate();
      if (!(r >= 0.0f && r < 1.0f)) {
        return FieldError(index, "dropout.rate",
                          absl::StrCat(r, " must be in [0, 1)"));
      }
      return in;
    }
    case v1::LayerSpec::kLayerNorm:
      RETURN_IF_ERROR(RequireLastDim(index, "layer_norm.features",
                                     layer.layer_norm().features(), in));
      return in;
    case v1::LayerSpec::kFlatten:
      return Shape{NumElements(in)};
    case v1::LayerSpec::kEmbedding: {
      const auto& e = layer.embedding();
      RETURN_IF_ERROR(
          RequirePositive(index, "embedding.vocab_size", e.vocab_size()));
      RETURN_IF_ERROR(RequirePositive(index, "embedding.dim", e.dim()));
      RETURN_IF_ERROR(
          RequirePositive(index, "embedding.max_seq_len", e.max_seq_len()));
      if (in.size() != 1 || in[0] > e.max_seq_len()) {
        return FieldError(
            index, "embedding.max_seq_len",
            absl::StrCat("input must be token ids [T] with T <= ",
                         e.max_seq_len(), ", got ", ShapeToString(in)));
      }
      return Shape{in[0], e.dim()};
    }
    case v1::LayerSpec::kAttention:
    case v1::LayerSpec::kTransformerBlock: {
      const bool attn = layer.has_attention();
      const std::string kind = attn ? "attention" : "transformer_block";
      const int64_t dim =
          attn ? layer.attention().dim() : layer.transformer_block().dim();
      const int64_t heads =
          attn ? layer.attention().heads() : layer.transformer_block().heads();
      RETURN_IF_ERROR(RequireLastDim(index, kind + ".dim", dim, in));
      RETURN_IF_ERROR(RequirePositive(index, kind + ".heads", heads));
      if (dim % heads != 0) {
        return FieldError(index, kind + ".heads",
                          absl::StrCat(heads, " does not divide dim ", dim));
      }
      if (in.size() != 2) {
        return FieldError(
            index, kind + ".dim",
            absl::StrCat("input must be [T, dim], got ", ShapeToString(in)));
      }
      if (!attn && layer.transformer_block().mlp_dim() < 0) {
        return FieldError(index, "transformer_block.mlp_dim",
                          "must be >= 0 (0 means 4 * dim)");
      }
      return in;
    }
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return FieldError(index, "kind",
                    "no layer kind set (want one of linear, relu, gelu, "
                    "layer_norm, dropout, embedding, attention, "
                    "transformer_block, flatten)");
}

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
  return FieldError(index, "kind", "no layer kind set");
}

}  // namespace

absl::StatusOr<std::vector<Shape>> ValidateModelSpec(
    const v1::ModelSpec& spec) {
  if (spec.layers().empty()) {
    return absl::InvalidArgumentError("model.layers: the model has no layers");
  }
  if (spec.input_shape().empty()) {
    return absl::InvalidArgumentError(
        "model.input_shape: missing (the shape of one sample, e.g. [784])");
  }
  Shape shape(spec.input_shape().begin(), spec.input_shape().end());
  for (int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.input_shape: ", ShapeToString(shape), " has a size <= 0"));
    }
  }
  if (spec.input_kind() == v1::INPUT_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "model.input_kind: missing (INPUT_KIND_FLOAT or INPUT_KIND_TOKENS)");
  }
  if (spec.loss() == v1::LOSS_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "model.loss: missing (LOSS_KIND_SOFTMAX_CROSS_ENTROPY)");
  }
  const bool tokens = spec.input_kind() == v1::INPUT_KIND_TOKENS;
  if (tokens != spec.layers(0).has_embedding()) {
    return FieldError(0, "kind",
                      tokens ? "token input needs an embedding first layer"
                             : "an embedding layer needs INPUT_KIND_TOKENS");
  }
  std::vector<Shape> shapes = {shape};
  for (int i = 0; i < spec.layers_size(); ++i) {
    if (i > 0 && spec.layers(i).has_embedding()) {
      return FieldError(i, "embedding",
                        "only the first layer may embed tokens");
    }
    ASSIGN_OR_RETURN(shape, OutputShape(spec.layers(i), i, shape));
    shapes.push_back(shape);
  }
  return shapes;
}

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
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
