#include "spec/dataset_spec.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/shape.h"
#include "common/status_macros.h"
#include "spec/model_spec.h"

namespace pipetrain {
namespace {

absl::Status RequirePath(const std::string& path, const char* field) {
  if (!path.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": missing (the path of a file on the worker)"));
}

absl::Status RequireRange(int64_t value, int64_t low, const char* field) {
  if (value >= low && value <= kMaxDatasetClasses) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", value, " must lie in ", low, "..", kMaxDatasetClasses));
}

absl::Status RequireFinite(float value, bool may_be_negative,
                           const char* field) {
  if (std::isfinite(value) && (may_be_negative || value >= 0)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", value,
      may_be_negative ? " must be finite" : " must be finite and >= 0"));
}

absl::Status RequireTokenFile(const std::string& path, const char* field) {
  RETURN_IF_ERROR(RequirePath(path, field));
  if (absl::EndsWith(path, ".bin") || absl::EndsWith(path, ".npy")) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", path, " must end in .bin (raw uint16 token ids) or .npy"));
}

}  // namespace

absl::Status ValidateNumpySource(const v1::NumpySource& source) {
  RETURN_IF_ERROR(
      RequirePath(source.train_features(), "data.numpy.train_features"));
  RETURN_IF_ERROR(
      RequirePath(source.train_labels(), "data.numpy.train_labels"));
  RETURN_IF_ERROR(
      RequirePath(source.eval_features(), "data.numpy.eval_features"));
  RETURN_IF_ERROR(RequirePath(source.eval_labels(), "data.numpy.eval_labels"));
  RETURN_IF_ERROR(RequireRange(source.classes(), 2, "data.numpy.classes"));
  RETURN_IF_ERROR(RequireFinite(source.scale(), false, "data.numpy.scale"));
  RETURN_IF_ERROR(RequireFinite(source.mean(), true, "data.numpy.mean"));
  return RequireFinite(source.std(), false, "data.numpy.std");
}

absl::Status ValidateTokenShardSource(const v1::TokenShardSource& source) {
  RETURN_IF_ERROR(
      RequireTokenFile(source.train_file(), "data.token_shards.train_file"));
  RETURN_IF_ERROR(
      RequireTokenFile(source.eval_file(), "data.token_shards.eval_file"));
  RETURN_IF_ERROR(
      RequireRange(source.seq_len(), 1, "data.token_shards.seq_len"));
  return RequireRange(source.vocab_size(), 2, "data.token_shards.vocab_size");
}

absl::Status ValidateDatasetSpec(const v1::DatasetSpec& data) {
  if (data.has_numpy()) return ValidateNumpySource(data.numpy());
  if (data.has_token_shards()) {
    return ValidateTokenShardSource(data.token_shards());
  }
  return absl::OkStatus();
}

absl::Status ValidateDatasetFitsModel(const v1::TrainingSpec& spec) {
  const v1::DatasetSpec& data = spec.data();
  if (!data.has_numpy() && !data.has_token_shards()) return absl::OkStatus();
  absl::StatusOr<std::vector<Shape>> shapes = ValidateModelSpec(spec.model());
  if (!shapes.ok() || shapes->back().empty()) return absl::OkStatus();
  const int64_t width = shapes->back().back();
  const int64_t classes = data.has_numpy() ? data.numpy().classes()
                                           : data.token_shards().vocab_size();
  if (classes != width) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.has_numpy() ? "data.numpy.classes: "
                         : "data.token_shards.vocab_size: ",
        classes, " does not match the model's output width ", width));
  }
  if (data.has_token_shards()) {
    const int64_t window = NumElements(shapes->front());
    if (data.token_shards().seq_len() != window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.token_shards.seq_len: ", data.token_shards().seq_len(),
          " does not match the model's input of ", window, " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
