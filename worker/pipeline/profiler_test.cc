// ProfileLayers: what the profile runs, watched through a backend that
// records the products it is asked for.
#include "worker/pipeline/profiler.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/forwarding_backend.h"

namespace pipetrain {
namespace {

// test_specs::kSmallMlpTraining: Linear 12 -> 32, GELU, dropout,
// LayerNorm, Linear 32 -> 16, ReLU, Linear 16 -> 4; batch 32 in
// `micro_batches`.
v1::TrainingSpec Spec(int micro_batches) {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(test_specs::kSmallMlpTraining, &spec);
  EXPECT_TRUE(status.ok()) << status;
  spec.set_micro_batches(micro_batches);
  return spec;
}

// Records, for the products of the last Linear (16 -> 4), the smallest
// input value of its forward, and counts the weight-gradient products
// (x^T dy) that add to the gradient held (beta 1) and that write it
// (beta 0), and their depths.
class RecordingBackend : public ForwardingBackend {
 public:
  RecordingBackend() : ForwardingBackend(CreateCpuBackend(1)) {}

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float beta, float* c, int64_t ldc) override {
    if (!trans_a && !trans_b && n == 4 && k == 16) {
      for (int64_t i = 0; i < m * k; ++i) {
        smallest_last_input = std::min(smallest_last_input, a[i]);
      }
    }
    if (trans_a && !trans_b) {
      ++(beta == 0.0f ? gradient_writes : gradient_adds);
      gradient_depths.push_back(k);
    }
    return ForwardingBackend::Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b,
                                   ldb, beta, c, ldc);
  }

  float smallest_last_input = std::numeric_limits<float>::infinity();
  int gradient_writes = 0;
  int gradient_adds = 0;
  // The depth (rows) of every weight-gradient product.
  std::vector<int64_t> gradient_depths;
};

// In place, not alone: the layer after the ReLU is timed on what the ReLU
// gave it (never negative), as a stage runs it, not on an input made up
// for it alone.
TEST(ProfilerTest, TimesEachLayerOnWhatTheLayerBeforeGaveIt) {
  RecordingBackend backend;
  absl::StatusOr<v1::ProfileResponse> profile =
      ProfileLayers(Spec(4), 0, 3, &backend);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->layers_size(), 7);
  EXPECT_LT(backend.smallest_last_input,
            std::numeric_limits<float>::infinity());
  EXPECT_GE(backend.smallest_last_input, 0.0f);
}

// With several micro-batches a step, all but the first add their weight
// gradients to the ones the step holds (reading them back): the timed
// backward passes add. With one micro-batch a step every backward writes.
TEST(ProfilerTest, TimesTheGradientAddingOfAStepsLaterMicroBatches) {
  RecordingBackend several;
  ASSERT_TRUE(ProfileLayers(Spec(4), 0, 3, &several).ok());
  // Three Linear layers, three timed runs each (and a warm-up round).
  EXPECT_GE(several.gradient_adds, 3 * 3);
  RecordingBackend one;
  ASSERT_TRUE(ProfileLayers(Spec(1), 0, 3, &one).ok());
  EXPECT_EQ(one.gradient_adds, 0);
  EXPECT_GE(one.gradient_writes, 3 * 3);
}

// A synchronous stage reusing its weights takes a step's weight gradients
// in one product over all of its micro-batches' rows (DefersWeightGrads):
// so does its profile, with the micro-batch held once per micro-batch of a
// step (4 x 8 rows). Rematerializing, a stage runs one product per
// micro-batch, and so does the profile.
TEST(ProfilerTest, TimesTheWeightGradientsAsAStepTakesThem) {
  RecordingBackend held;
  ASSERT_TRUE(ProfileLayers(Spec(4), 0, 3, &held, false, true).ok());
  ASSERT_FALSE(held.gradient_depths.empty());
  for (int64_t k : held.gradient_depths) EXPECT_EQ(k, 4 * 8);
  RecordingBackend remat;
  v1::TrainingSpec spec = Spec(4);
  spec.set_rematerialize(true);
  ASSERT_TRUE(ProfileLayers(spec, 0, 3, &remat, false, true).ok());
  ASSERT_FALSE(remat.gradient_depths.empty());
  for (int64_t k : remat.gradient_depths) EXPECT_EQ(k, 8);
}

TEST(ProfilerTest, ChainsHoldConsecutiveLayersUpToTheParameterBytes) {
  const v1::ModelSpec model = Spec(4).model();
  // Parameter bytes per layer: 1664 (Linear 12 -> 32), 0, 0, 256
  // (LayerNorm), 2112 (Linear 32 -> 16), 0, 272 (Linear 16 -> 4): 4304.
  using Chains = std::vector<std::pair<int, int>>;
  EXPECT_EQ(*ProfileChains(model, 4304), (Chains{{0, 7}}));
  EXPECT_EQ(*ProfileChains(model, 4303), (Chains{{0, 6}, {6, 7}}));
  // A layer without parameters joins the chain before it until that is
  // full, then starts the next one; a layer over the limit stands alone.
  EXPECT_EQ(*ProfileChains(model, 1),
            (Chains{{0, 1}, {1, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}}));
  v1::ModelSpec bad = model;
  bad.mutable_layers(0)->mutable_linear()->set_in_features(int64_t{1} << 40);
  EXPECT_FALSE(ProfileChains(bad, 4304).ok());
}

// A model profiled in several chains reports every layer as one chain
// does: its kind, sizes and times.
TEST(ProfilerTest, SeveralChainsProfileEveryLayer) {
  auto backend = CreateCpuBackend(1);
  absl::StatusOr<v1::ProfileResponse> one =
      ProfileLayers(Spec(4), 0, 3, backend.get());
  absl::StatusOr<v1::ProfileResponse> several =
      ProfileLayers(Spec(4), 0, 3, backend.get(), false, false,
                    /*max_chain_parameter_bytes=*/1);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(several.ok()) << several.status();
  ASSERT_EQ(several->layers_size(), 7);
  for (int i = 0; i < 7; ++i) {
    const v1::LayerProfile& a = one->layers(i);
    const v1::LayerProfile& b = several->layers(i);
    EXPECT_EQ(b.layer(), i);
    EXPECT_EQ(b.kind(), a.kind());
    EXPECT_EQ(b.activation_bytes(), a.activation_bytes());
    EXPECT_EQ(b.parameter_bytes(), a.parameter_bytes());
    EXPECT_GT(b.forward_seconds(), 0);
    EXPECT_GT(b.backward_seconds(), 0);
    EXPECT_EQ(b.optimizer_seconds() > 0, b.parameter_bytes() > 0);
  }
  // Batch 32 / 4 micro-batches = 8 rows: Linear 12 -> 32 outputs 8 x 32
  // floats, with 12 x 32 + 32 parameters.
  EXPECT_EQ(one->layers(0).activation_bytes(), 8 * 32 * 4);
  EXPECT_EQ(one->layers(0).parameter_bytes(), (12 * 32 + 32) * 4);
  EXPECT_EQ(one->layers(6).parameter_bytes(), (16 * 4 + 4) * 4);
}

}  // namespace
}  // namespace pipetrain
