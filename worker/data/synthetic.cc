#include "worker/data/synthetic.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace {

// Keeps the synthetic data's random streams apart from other users of the
// job seed (initialization, dropout, data order).
constexpr uint64_t kSyntheticSalt = 0x73796e7468646174ull;  // "synthdat"
constexpr uint64_t kTeacherStream = 1;
constexpr uint64_t kTrainStream = 2;
constexpr uint64_t kEvalStream = 3;

// A standard-normal value that is a pure function of (seed, index):
// Box-Muller on two counter-based uniforms.
float GaussianAt(uint64_t seed, uint64_t index) {
  constexpr double kTwoPi = 6.283185307179586;
  // 1 - u lies in (0, 1], so the logarithm stays finite.
  const double u1 = 1.0 - math::UniformAt(seed, 2 * index);
  const double u2 = math::UniformAt(seed, 2 * index + 1);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(kTwoPi * u2));
}

// The teacher weights W[classes, features], shared by both splits.
using Teacher = std::vector<float>;

// One split. Immutable after construction; GetInput, GetLabel and Get are
// thread-safe. A label is computed from its sample's features, so a reader
// of labels alone generates them too (and drops them).
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::shared_ptr<const Teacher> teacher, int64_t features,
                   int64_t classes, int64_t samples, uint64_t stream_seed)
      : teacher_(std::move(teacher)),
        features_(features),
        classes_(classes),
        samples_(samples),
        stream_seed_(stream_seed) {}

  int64_t size() const override { return samples_; }
  Shape sample_shape() const override { return {features_}; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return classes_; }

  DataParts parts() const override { return kAllDataParts; }

  void GetInput(int64_t index, float* input) const override {
    const uint64_t sample_seed = math::SplitMix64(
        stream_seed_ ^ math::SplitMix64(static_cast<uint64_t>(index)));
    for (int64_t f = 0; f < features_; ++f) {
      input[f] = GaussianAt(sample_seed, static_cast<uint64_t>(f));
    }
  }

  void GetLabel(int64_t index, float* label) const override {
    std::vector<float> input(static_cast<size_t>(features_));
    GetInput(index, input.data());
    label[0] = static_cast<float>(TeacherClass(input.data()));
  }

  void Get(int64_t index, float* input, float* label) const override {
    GetInput(index, input);
    label[0] = static_cast<float>(TeacherClass(input));
  }

 private:
  // The teacher's argmax over classes for one sample's features.
  int64_t TeacherClass(const float* input) const {
    int64_t best_class = 0;
    double best_score = 0.0;
    for (int64_t c = 0; c < classes_; ++c) {
      const float* row = teacher_->data() + c * features_;
      double score = 0.0;
      for (int64_t f = 0; f < features_; ++f) score += row[f] * input[f];
      if (c == 0 || score > best_score) {
        best_class = c;
        best_score = score;
      }
    }
    return best_class;
  }

  // Constant after construction.
  const std::shared_ptr<const Teacher> teacher_;
  const int64_t features_;
  const int64_t classes_;
  const int64_t samples_;
  const uint64_t stream_seed_;
};

absl::Status RequirePositive(int64_t value, const char* field) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("data.synthetic.", field, " must be positive, got ", value));
}

absl::Status ValidateSource(const v1::SyntheticSource& source) {
  RETURN_IF_ERROR(RequirePositive(source.features(), "features"));
  if (source.classes() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.synthetic.classes must be at least 2, got ", source.classes()));
  }
  RETURN_IF_ERROR(RequirePositive(source.train_samples(), "train_samples"));
  RETURN_IF_ERROR(RequirePositive(source.eval_samples(), "eval_samples"));
  if (source.features() > kMaxSyntheticTeacherWeights / source.classes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.synthetic.features * data.synthetic.classes = ",
        source.features(), " * ", source.classes(), " exceeds the limit of ",
        kMaxSyntheticTeacherWeights, " teacher weights"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DatasetPair> OpenSynthetic(const v1::SyntheticSource& source,
                                          uint64_t seed) {
  RETURN_IF_ERROR(ValidateSource(source));
  const int64_t features = source.features();
  const int64_t classes = source.classes();
  const uint64_t data_seed = math::SplitMix64(seed ^ kSyntheticSalt);

  auto teacher = std::make_shared<Teacher>(classes * features);
  const uint64_t teacher_seed = math::SplitMix64(data_seed ^ kTeacherStream);
  for (size_t i = 0; i < teacher->size(); ++i) {
    (*teacher)[i] = GaussianAt(teacher_seed, i);
  }

  DatasetPair pair;
  pair.train = std::make_unique<SyntheticDataset>(
      teacher, features, classes, source.train_samples(),
      math::SplitMix64(data_seed ^ kTrainStream));
  pair.eval = std::make_unique<SyntheticDataset>(
      std::move(teacher), features, classes, source.eval_samples(),
      math::SplitMix64(data_seed ^ kEvalStream));
  return pair;
}

}  // namespace pipetrain
