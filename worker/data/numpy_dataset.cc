#include "worker/data/numpy_dataset.h"

#include <array>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spec/dataset_spec.h"

namespace pipetrain {
namespace {

std::string ShapeText(const NpyHeader& header) {
  return absl::StrCat(NpyDtypeName(header.dtype), " (",
                      absl::StrJoin(header.shape, ", "), ")");
}

// Immutable after construction; GetInput and GetLabel are thread-safe.
// Opened for one part, it holds only that part's file (`features` or
// `labels` then has no file).
class NumpyDataset final : public Dataset {
 public:
  NumpyDataset(NpyArray features, NpyArray labels, int64_t classes, float scale,
               float mean, float std)
      : features_(std::move(features)),
        labels_(std::move(labels)),
        classes_(classes),
        scale_(scale),
        mean_(mean),
        std_(std),
        size_(features_.file != nullptr ? features_.header.shape[0]
                                        : labels_.header.shape[0]),
        sample_numel_(features_.file == nullptr || size_ == 0
                          ? 0
                          : features_.header.elements / size_) {
    for (int v = 0; v < 256; ++v) byte_to_input_[v] = Transform(v);
  }

  int64_t size() const override { return size_; }
  Shape sample_shape() const override {
    if (features_.file == nullptr) return {};
    return Shape(features_.header.shape.begin() + 1,
                 features_.header.shape.end());
  }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return classes_; }
  DataParts parts() const override {
    return {features_.file != nullptr, labels_.file != nullptr};
  }

  void GetInput(int64_t index, float* input) const override {
    const uint8_t* base = features_.data();
    if (features_.header.dtype == NpyDtype::kUint8) {
      const uint8_t* sample = base + index * sample_numel_;
      for (int64_t k = 0; k < sample_numel_; ++k) {
        input[k] = byte_to_input_[sample[k]];
      }
    } else {
      // memcpy: the data of a .npy need not be 4-byte aligned.
      std::memcpy(input, base + index * sample_numel_ * 4, sample_numel_ * 4);
      for (int64_t k = 0; k < sample_numel_; ++k)
        input[k] = Transform(input[k]);
    }
  }

  void GetLabel(int64_t index, float* label) const override {
    label[0] = static_cast<float>(
        NpyIntegerAt(labels_.data(), labels_.header.dtype, index));
  }

 private:
  float Transform(float x) const { return (x * scale_ - mean_) / std_; }

  // Constant after construction.
  const NpyArray features_;
  const NpyArray labels_;
  const int64_t classes_;
  const float scale_, mean_, std_;
  const int64_t size_;
  const int64_t sample_numel_;
  std::array<float, 256> byte_to_input_;
};

absl::Status CheckFeatures(const NpyHeader& h, const std::string& field,
                           const v1::NumpySource& source) {
  if (h.dtype != NpyDtype::kFloat32 && h.dtype != NpyDtype::kUint8) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": features are ", ShapeText(h),
                     "; expected float32 or uint8 (arr.astype(np.float32))"));
  }
  if (h.dtype == NpyDtype::kUint8 && source.scale() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ": uint8 features need data.numpy.scale (e.g. 1/255 = "
                     "0.003921569)"));
  }
  if (h.shape.empty() || h.shape[0] == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": features are ", ShapeText(h),
                     "; expected [samples, ...] with at least one sample"));
  }
  return absl::OkStatus();
}

// Labels: [N] integers, each in 0..classes-1, and as many as the
// features' N when the features are open too (`samples` >= 0; -1 when
// they are not). The range check reads every label once (N small
// integers).
absl::Status CheckLabels(const NpyArray& labels, const std::string& field,
                         int64_t samples, const std::string& features_field,
                         int64_t classes) {
  const NpyHeader& h = labels.header;
  if (!NpyIsInteger(h.dtype) || h.shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": labels are ", ShapeText(h),
                     "; expected a 1-D integer array (uint8, int32, int64)"));
  }
  if (samples >= 0 && h.shape[0] != samples) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " holds ", h.shape[0], " labels but ",
                     features_field, " holds ", samples, " samples"));
  }
  if (h.shape[0] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": labels are ", ShapeText(h), "; expected at least one label"));
  }
  for (int64_t i = 0; i < h.shape[0]; ++i) {
    const int64_t label = NpyIntegerAt(labels.data(), h.dtype, i);
    if (label < 0 || label >= classes) {
      return absl::DataLossError(absl::StrCat(
          field, ": label ", label, " of sample ", i, " is outside 0..",
          classes - 1, " (data.numpy.classes = ", classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpyArray> OpenNpyArray(const std::string& path,
                                      const std::string& field) {
  NpyArray array;
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(field, ": ", file.status().message()));
  }
  array.file = *std::move(file);
  absl::StatusOr<NpyHeader> header =
      ParseNpyFile(array.file->bytes(), absl::StrCat(field, ": ", path));
  if (!header.ok()) return header.status();
  array.header = *std::move(header);
  return array;
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadNumpySplit(
    const v1::NumpySource& source, const std::string& features_path,
    const std::string& labels_path, const std::string& split, DataParts parts) {
  if (!parts.any()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.numpy.", split, ": opened for no part"));
  }
  const std::string features_field =
      absl::StrCat("data.numpy.", split, "_features ", features_path);
  const std::string labels_field =
      absl::StrCat("data.numpy.", split, "_labels ", labels_path);
  NpyArray features;
  int64_t samples = -1;
  if (parts.inputs) {
    ASSIGN_OR_RETURN(
        features, OpenNpyArray(features_path, absl::StrCat("data.numpy.", split,
                                                           "_features")));
    RETURN_IF_ERROR(CheckFeatures(features.header, features_field, source));
    samples = features.header.shape[0];
  }
  NpyArray labels;
  if (parts.labels) {
    ASSIGN_OR_RETURN(
        labels, OpenNpyArray(labels_path,
                             absl::StrCat("data.numpy.", split, "_labels")));
    RETURN_IF_ERROR(CheckLabels(labels, labels_field, samples, features_field,
                                source.classes()));
  }
  const float scale = source.scale() == 0 ? 1.0f : source.scale();
  const float std = source.std() == 0 ? 1.0f : source.std();
  return std::make_unique<NumpyDataset>(std::move(features), std::move(labels),
                                        source.classes(), scale, source.mean(),
                                        std);
}

absl::StatusOr<DatasetPair> OpenNumpy(const v1::NumpySource& source,
                                      DataParts parts) {
  RETURN_IF_ERROR(ValidateNumpySource(source));
  DatasetPair pair;
  ASSIGN_OR_RETURN(pair.train,
                   LoadNumpySplit(source, source.train_features(),
                                  source.train_labels(), "train", parts));
  ASSIGN_OR_RETURN(pair.eval,
                   LoadNumpySplit(source, source.eval_features(),
                                  source.eval_labels(), "eval", parts));
  return pair;
}

}  // namespace pipetrain
