#include "spec/size_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/model_spec.h"

namespace pipetrain {
namespace {

// The elements of a rows x cols parameter, checked against the cap.
absl::StatusOr<int64_t> Matrix(int64_t rows, int64_t cols,
                               const std::string& what) {
  return CheckedElements({rows, cols}, what);
}

// Sums parameter tensors; each was checked, so the sum of a few stays far
// from overflowing.
absl::StatusOr<int64_t> Sum(std::initializer_list<absl::StatusOr<int64_t>> n) {
  int64_t total = 0;
  for (const absl::StatusOr<int64_t>& part : n) {
    RETURN_IF_ERROR(part.status());
    total += *part;
  }
  return total;
}

}  // namespace

absl::StatusOr<int64_t> CheckedElements(const Shape& shape,
                                        const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxDimension) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dimension ", d, " of ", ShapeToString(shape),
                       " is outside [0, ", kMaxDimension, "] (the limit)"));
    }
    const std::optional<int64_t> product = CheckedMul(n, d);
    if (!product.has_value() || *product > kMaxTensorElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", ShapeToString(shape), " has more than ",
                       kMaxTensorElements, " elements (the limit)"));
    }
    n = *product;
  }
  return n;
}

absl::StatusOr<int64_t> LayerParameters(const v1::LayerSpec& layer) {
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear: {
      const auto& l = layer.linear();
      return Sum({Matrix(l.in_features(), l.out_features(), "linear weight"),
                  l.out_features()});
    }
    case v1::LayerSpec::kLayerNorm:
      return Sum({Matrix(2, layer.layer_norm().features(), "layer_norm")});
    case v1::LayerSpec::kEmbedding: {
      const auto& e = layer.embedding();
      return Sum({Matrix(e.vocab_size(), e.dim(), "embedding table"),
                  Matrix(e.max_seq_len(), e.dim(), "position table")});
    }
    case v1::LayerSpec::kAttention: {
      const int64_t d = layer.attention().dim();
      ASSIGN_OR_RETURN(const int64_t proj,
                       Matrix(d, d, "attention projection"));
      return 4 * proj + 4 * d;
    }
    case v1::LayerSpec::kTransformerBlock: {
      const auto& b = layer.transformer_block();
      const int64_t d = b.dim();
      const int64_t mlp = b.mlp_dim() == 0 ? 4 * d : b.mlp_dim();
      ASSIGN_OR_RETURN(const int64_t proj,
                       Matrix(d, d, "attention projection"));
      ASSIGN_OR_RETURN(const int64_t fc, Matrix(d, mlp, "mlp weight"));
      return 4 * proj + 2 * fc + 8 * d + mlp;
    }
    default:
      return 0;
  }
}

absl::StatusOr<JobFootprint> EstimateFootprint(const v1::TrainingSpec& spec) {
  ASSIGN_OR_RETURN(const std::vector<Shape> shapes,
                   ValidateModelSpec(spec.model()));
  JobFootprint f;
  for (const v1::LayerSpec& layer : spec.model().layers()) {
    ASSIGN_OR_RETURN(const int64_t n, LayerParameters(layer));
    f.parameters += n;  // <= kMaxLayers * a few caps: no overflow
  }
  const int64_t rows =
      spec.batch_size() / std::max<int64_t>(1, spec.micro_batches());
  for (const Shape& sample : shapes) {
    Shape batch = {rows};
    batch.insert(batch.end(), sample.begin(), sample.end());
    ASSIGN_OR_RETURN(const int64_t n,
                     CheckedElements(batch, "a micro-batch's activation"));
    f.largest_activation_elements = std::max(f.largest_activation_elements, n);
  }
  f.min_bytes = int64_t{4} * (2 * f.parameters + f.largest_activation_elements);
  return f;
}

}  // namespace pipetrain
