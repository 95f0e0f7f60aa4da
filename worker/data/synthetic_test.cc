#include "worker/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;

v1::SyntheticSource Source(int64_t features = kFeatures,
                           int64_t classes = kClasses,
                           int64_t train_samples = 2000,
                           int64_t eval_samples = 500) {
  v1::SyntheticSource source;
  source.set_features(features);
  source.set_classes(classes);
  source.set_train_samples(train_samples);
  source.set_eval_samples(eval_samples);
  return source;
}

DatasetPair OpenOrDie(uint64_t seed) {
  absl::StatusOr<DatasetPair> pair = OpenSynthetic(Source(), seed);
  EXPECT_TRUE(pair.ok()) << pair.status();
  return pair.ok() ? std::move(pair).value() : DatasetPair{};
}

struct Sample {
  std::vector<float> features;
  float label;
};

Sample GetSample(const Dataset& dataset, int64_t index) {
  Sample sample{std::vector<float>(kFeatures), -1.0f};
  dataset.Get(index, sample.features.data(), &sample.label);
  return sample;
}

TEST(SyntheticTest, ShapesAndSizesFollowTheSpec) {
  const DatasetPair pair = OpenOrDie(1);
  ASSERT_NE(pair.train, nullptr);
  EXPECT_EQ(pair.train->size(), 2000);
  EXPECT_EQ(pair.eval->size(), 500);
  EXPECT_THAT(pair.train->sample_shape(), ElementsAre(kFeatures));
  EXPECT_TRUE(pair.train->label_shape().empty());
  EXPECT_EQ(pair.train->num_classes(), kClasses);
}

TEST(SyntheticTest, SamplesArePureFunctionsOfSeedAndIndex) {
  const DatasetPair a = OpenOrDie(7);
  const DatasetPair b = OpenOrDie(7);
  ASSERT_NE(a.train, nullptr);
  ASSERT_NE(b.train, nullptr);
  for (int64_t i : {0, 1, 999, 1999}) {
    const Sample first = GetSample(*a.train, i);
    EXPECT_EQ(first.features, GetSample(*b.train, i).features) << i;
    EXPECT_EQ(first.label, GetSample(*b.train, i).label) << i;
    EXPECT_EQ(first.features, GetSample(*a.train, i).features) << i;
  }
  EXPECT_NE(GetSample(*a.train, 0).features, GetSample(*a.train, 1).features);
  EXPECT_NE(GetSample(*a.train, 0).features, GetSample(*a.eval, 0).features);
}

TEST(SyntheticTest, DifferentSeedsDiffer) {
  const DatasetPair a = OpenOrDie(1);
  const DatasetPair b = OpenOrDie(2);
  ASSERT_NE(a.train, nullptr);
  ASSERT_NE(b.train, nullptr);
  EXPECT_NE(GetSample(*a.train, 0).features, GetSample(*b.train, 0).features);
}

TEST(SyntheticTest, LabelsAreClassIdsAndEveryClassOccurs) {
  const DatasetPair pair = OpenOrDie(3);
  ASSERT_NE(pair.train, nullptr);
  std::vector<int> counts(kClasses, 0);
  for (int64_t i = 0; i < pair.train->size(); ++i) {
    const float label = GetSample(*pair.train, i).label;
    ASSERT_GE(label, 0.0f);
    ASSERT_LT(label, static_cast<float>(kClasses));
    ASSERT_EQ(label, std::floor(label));
    ++counts[static_cast<int>(label)];
  }
  for (int c = 0; c < kClasses; ++c) {
    EXPECT_GT(counts[c], 2000 / kClasses / 5) << "class " << c;
  }
}

// Either part alone (a pipeline's two ends) is what Get gives together.
TEST(SyntheticTest, InputsAndLabelsAloneEqualBoth) {
  const DatasetPair pair = OpenOrDie(6);
  ASSERT_NE(pair.train, nullptr);
  for (int64_t i = 0; i < 50; ++i) {
    const Sample both = GetSample(*pair.train, i);
    std::vector<float> features(kFeatures);
    pair.train->GetInput(i, features.data());
    float label = -1.0f;
    pair.train->GetLabel(i, &label);
    EXPECT_EQ(features, both.features) << i;
    EXPECT_EQ(label, both.label) << i;
  }
}

TEST(SyntheticTest, FeaturesAreStandardNormal) {
  const DatasetPair pair = OpenOrDie(4);
  ASSERT_NE(pair.train, nullptr);
  double sum = 0.0;
  double sum_squares = 0.0;
  for (int64_t i = 0; i < pair.train->size(); ++i) {
    for (float x : GetSample(*pair.train, i).features) {
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sum_squares += static_cast<double>(x) * x;
    }
  }
  const double n = 2000.0 * kFeatures;
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sum_squares / n, 1.0, 0.05);
}

// The labels come from a linear teacher, so even a nearest-class-mean
// classifier fitted on the train split beats chance by far on eval.
TEST(SyntheticTest, TaskIsLearnableAcrossSplits) {
  const DatasetPair pair = OpenOrDie(5);
  ASSERT_NE(pair.train, nullptr);
  std::vector<std::vector<double>> means(kClasses,
                                         std::vector<double>(kFeatures, 0.0));
  std::vector<int> counts(kClasses, 0);
  for (int64_t i = 0; i < pair.train->size(); ++i) {
    const Sample s = GetSample(*pair.train, i);
    const int c = static_cast<int>(s.label);
    ++counts[c];
    for (int64_t f = 0; f < kFeatures; ++f) means[c][f] += s.features[f];
  }
  int correct = 0;
  for (int64_t i = 0; i < pair.eval->size(); ++i) {
    const Sample s = GetSample(*pair.eval, i);
    int best = 0;
    double best_score = -1e30;
    for (int c = 0; c < kClasses; ++c) {
      double score = 0.0;
      for (int64_t f = 0; f < kFeatures; ++f) {
        score += means[c][f] / std::max(counts[c], 1) * s.features[f];
      }
      if (score > best_score) {
        best = c;
        best_score = score;
      }
    }
    if (best == static_cast<int>(s.label)) ++correct;
  }
  EXPECT_GT(correct, pair.eval->size() * 6 / 10);
}

// The float generator against Box-Muller in double precision with libm's
// log, cos and sin on the same uniforms: value 2j is r cos(2 pi u2), value
// 2j + 1 is r sin(2 pi u2), r = sqrt(-2 ln u1). Counts that are odd, that
// end inside a chunk and that span several chunks, and uniforms near 0
// and 1 (the largest radii) among many seeds.
TEST(SyntheticTest, GaussiansAreBoxMullerOfTheirUniforms) {
  constexpr double kTwoPi = 6.283185307179586;
  double largest_radius = 0.0;
  for (int64_t count : {1, 2, 7, 64, 129, 300}) {
    for (uint64_t seed = 0; seed < 200; ++seed) {
      std::vector<float> values(static_cast<size_t>(count), NAN);
      SyntheticGaussians(seed, count, values.data());
      for (int64_t v = 0; v < count; ++v) {
        const uint64_t j = static_cast<uint64_t>(v / 2);
        const double u1 = 1.0 - math::UniformAt(seed, 2 * j);
        const double u2 = math::UniformAt(seed, 2 * j + 1);
        const double r = std::sqrt(-2.0 * std::log(u1));
        largest_radius = std::max(largest_radius, r);
        const double want =
            v % 2 == 0 ? r * std::cos(kTwoPi * u2) : r * std::sin(kTwoPi * u2);
        ASSERT_NEAR(values[v], want, 2e-6 * std::max(1.0, r))
            << "seed " << seed << " count " << count << " value " << v;
      }
    }
  }
  EXPECT_GT(largest_radius, 3.5);  // the tail was reached
}

// A shorter run is a prefix of a longer one: the odd count's last value is
// the cosine of the pair a longer run completes.
TEST(SyntheticTest, GaussiansOfAShorterCountAreAPrefix) {
  std::vector<float> longer(301);
  SyntheticGaussians(42, 301, longer.data());
  for (int64_t count : {1, 2, 63, 64, 65, 128, 129, 300}) {
    std::vector<float> shorter(static_cast<size_t>(count));
    SyntheticGaussians(42, count, shorter.data());
    EXPECT_EQ(shorter,
              std::vector<float>(longer.begin(), longer.begin() + count))
        << count;
  }
}

// Both outputs of a pair are standard normal and uncorrelated; the fourth
// moment is a normal's 3 (a quarter-turn error in cos or sin would show in
// the mean, the correlation or the spread).
TEST(SyntheticTest, GaussianPairsAreIndependentStandardNormals) {
  constexpr int64_t kCount = 200000;
  std::vector<float> values(kCount);
  SyntheticGaussians(9, kCount, values.data());
  double sum[2] = {0, 0}, squares[2] = {0, 0}, fourth[2] = {0, 0};
  double cross = 0.0;
  for (int64_t j = 0; j < kCount / 2; ++j) {
    for (int k = 0; k < 2; ++k) {
      const double x = values[2 * j + k];
      sum[k] += x;
      squares[k] += x * x;
      fourth[k] += x * x * x * x;
    }
    cross += static_cast<double>(values[2 * j]) * values[2 * j + 1];
  }
  const double n = kCount / 2;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(sum[k] / n, 0.0, 0.01) << (k == 0 ? "cos" : "sin");
    EXPECT_NEAR(squares[k] / n, 1.0, 0.02) << (k == 0 ? "cos" : "sin");
    EXPECT_NEAR(fourth[k] / n, 3.0, 0.1) << (k == 0 ? "cos" : "sin");
  }
  EXPECT_NEAR(cross / n, 0.0, 0.01);
}

TEST(SyntheticTest, NonPositiveFieldsAreInvalidArgumentNamingThem) {
  struct Case {
    v1::SyntheticSource source;
    std::string field;
  };
  const std::vector<Case> cases = {
      {Source(0), "synthetic.features"},
      {Source(kFeatures, 0), "synthetic.classes"},
      {Source(kFeatures, 1), "synthetic.classes"},
      {Source(kFeatures, kClasses, -1), "synthetic.train_samples"},
      {Source(kFeatures, kClasses, 10, 0), "synthetic.eval_samples"},
      {Source(int64_t{1} << 40, kClasses), "synthetic.features"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DatasetPair> pair = OpenSynthetic(c.source, 1);
    ASSERT_FALSE(pair.ok()) << c.field;
    EXPECT_EQ(pair.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pair.status().message(), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace pipetrain
