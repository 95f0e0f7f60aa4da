#include "spec/model_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/size_limits.h"

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
  if (spec.layers_size() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.layers: ", spec.layers_size(),
                     " layers exceed the limit of ", kMaxLayers));
  }
  Shape shape(spec.input_shape().begin(), spec.input_shape().end());
  for (int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.input_shape: ", ShapeToString(shape), " has a size <= 0"));
    }
  }
  RETURN_IF_ERROR(CheckedElements(shape, "model.input_shape").status());
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
    // Sizes are checked layer by layer, so the next layer's arithmetic
    // (a flatten's product, a width) starts from numbers that fit.
    const std::string where = absl::StrCat("layers[", i, "]");
    RETURN_IF_ERROR(CheckedElements(shape, where + " output").status());
    if (absl::Status params = LayerParameters(spec.layers(i)).status();
        !params.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", params.message()));
    }
    shapes.push_back(shape);
  }
  return shapes;
}

}  // namespace pipetrain
