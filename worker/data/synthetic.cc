#include "worker/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"
#include "worker/compute/half.h"

namespace pipetrain {
namespace {

// Keeps the synthetic data's random streams apart from other users of the
// job seed (initialization, dropout, data order).
constexpr uint64_t kSyntheticSalt = 0x73796e7468646174ull;  // "synthdat"
constexpr uint64_t kTeacherStream = 1;
constexpr uint64_t kTrainStream = 2;
constexpr uint64_t kEvalStream = 3;

// Natural logarithm of u in (0, 1], in float arithmetic only (no libm
// call, so a loop of them vectorizes): u = m * 2^e with m in [sqrt(1/2),
// sqrt(2)), ln u = e ln 2 + 2 atanh((m - 1) / (m + 1)), the series to
// s^9 (|s| <= 0.172, so its first omitted term is below 7e-10).
inline float LogUnit(float u) {
  // Exponent relative to [sqrt(1/2), sqrt(2)): shift the mantissa's range
  // by the bits of sqrt(1/2) (0x3f3504f3) before splitting.
  const uint32_t shifted = FloatBits(u) - 0x3f3504f3u;
  const int32_t e = static_cast<int32_t>(shifted) >> 23;
  const float m = BitsToFloat((shifted & 0x007fffffu) + 0x3f3504f3u);
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float series =
      1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 / 9)));
  return static_cast<float>(e) * 0.69314718f + 2.0f * s * series;
}

// cos and sin of 2 pi t for t in [0, 1), in float arithmetic only: the
// quarter turn q = floor(4t) and theta = (4t - q) pi / 2 in [0, pi/2),
// Taylor polynomials to theta^12 and theta^11 (first omitted terms below
// 7e-9 and 6e-8), then (cos, sin) rotated by q quarter turns.
inline void CosSinTurn(float t, float* c, float* s) {
  const float quarters = 4.0f * t;
  const int32_t q = static_cast<int32_t>(quarters);  // floor: t >= 0
  const float x = (quarters - static_cast<float>(q)) * 1.57079633f;
  const float x2 = x * x;
  // Horner over x^2, highest power first.
  constexpr float kCos[] = {
      1.0f,         -1.0f / 2,       1.0f / 24,       -1.0f / 720,
      1.0f / 40320, -1.0f / 3628800, 1.0f / 479001600};
  constexpr float kSin[] = {1.0f,         -1.0f / 6,     1.0f / 120,
                            -1.0f / 5040, 1.0f / 362880, -1.0f / 39916800};
  float cx = kCos[6];
  for (int i = 5; i >= 0; --i) cx = kCos[i] + x2 * cx;
  float sx = kSin[5];
  for (int i = 4; i >= 0; --i) sx = kSin[i] + x2 * sx;
  sx *= x;
  // Quarter turns: q = 0: (cx, sx); 1: (-sx, cx); 2: (-cx, -sx); 3: (sx, -cx).
  const bool odd = (q & 1) != 0;
  const float cos_abs = odd ? sx : cx;
  const float sin_abs = odd ? cx : sx;
  *c = ((q + 1) & 2) != 0 ? -cos_abs : cos_abs;
  *s = (q & 2) != 0 ? -sin_abs : sin_abs;
}

}  // namespace

void SyntheticGaussians(uint64_t seed, int64_t count, float* out) {
  // The uniforms are hashed a chunk at a time, then the chunk's pairs go
  // through float arithmetic alone, a loop the compiler vectorizes.
  constexpr int64_t kChunk = 64;
  float u1[kChunk];
  float u2[kChunk];
  float cos_part[kChunk];
  float sin_part[kChunk];
  const int64_t pairs = (count + 1) / 2;  // an odd count uses a cos alone
  for (int64_t first = 0; first < pairs; first += kChunk) {
    const int64_t n = std::min(kChunk, pairs - first);
    for (int64_t j = 0; j < n; ++j) {
      const uint64_t i = static_cast<uint64_t>(2 * (first + j));
      // 1 - u lies in (0, 1], so the logarithm stays finite.
      u1[j] = 1.0f - math::UniformAt(seed, i);
      u2[j] = math::UniformAt(seed, i + 1);
    }
    for (int64_t j = 0; j < n; ++j) {
      const float r = std::sqrt(-2.0f * LogUnit(u1[j]));
      float c, s;
      CosSinTurn(u2[j], &c, &s);
      cos_part[j] = r * c;
      sin_part[j] = r * s;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = 2 * (first + j);
      out[v] = cos_part[j];
      if (v + 1 < count) out[v + 1] = sin_part[j];
    }
  }
}

namespace {

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
    SyntheticGaussians(sample_seed, features_, input);
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
  // The teacher's argmax over classes for one sample's features. Each
  // score sums its products in kLanes interleaved partial sums (feature f
  // into lane f % kLanes), which the compiler keeps in vector registers,
  // then adds the lanes in a fixed order: the same bits on every call.
  int64_t TeacherClass(const float* input) const {
    constexpr int64_t kLanes = 8;
    int64_t best_class = 0;
    double best_score = 0.0;
    for (int64_t c = 0; c < classes_; ++c) {
      const float* row = teacher_->data() + c * features_;
      float lanes[kLanes] = {};
      int64_t f = 0;
      for (; f + kLanes <= features_; f += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) {
          lanes[l] += row[f + l] * input[f + l];
        }
      }
      for (int64_t l = 0; f < features_; ++f, ++l) {
        lanes[l] += row[f] * input[f];
      }
      double score = 0.0;
      for (float lane : lanes) score += lane;
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
  SyntheticGaussians(teacher_seed, classes * features, teacher->data());

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
