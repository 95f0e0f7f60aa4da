// Finite-difference gradient checks for every layer and the loss, for
// inputs and parameters, on the CPU reference backend.
#include <cmath>
#include <functional>
#include <memory>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"
#include "worker/nn/loss.h"

namespace pipetrain {
namespace {

// Deterministic values in [lo, hi).
Tensor RandomHost(const Shape& shape, uint64_t seed, float lo = -1.0f,
                  float hi = 1.0f) {
  Tensor t = Tensor::Host(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] = lo + (hi - lo) * math::UniformAt(seed, i);
  }
  return t;
}

class GradientCheck : public ::testing::Test {
 protected:
  // L = sum(r * layer(x)) for a fixed random r. Checks dL/dx (when
  // check_input) and dL/dparam against central differences at up to
  // `probes` elements of each tensor.
  void Check(Layer* layer, const Tensor& x_host, bool check_input,
             float eps = 1e-2f, double tol = 2e-2, int probes = 24) {
    options_.training = true;
    options_.dropout_seed = 99;
    auto x = ToDevice(backend_.get(), x_host);
    ASSERT_TRUE(x.ok());
    LayerContext ctx;
    auto y = layer->Forward(*x, options_, &ctx);
    ASSERT_TRUE(y.ok()) << y.status();
    const Tensor r = RandomHost(y->shape(), 4242);
    ZeroGrads(layer->params());
    auto dx = layer->Backward(r, options_, &ctx, check_input);
    ASSERT_TRUE(dx.ok()) << dx.status();

    auto loss = [&]() -> double {
      auto out = layer->Forward(*x, options_, nullptr);
      EXPECT_TRUE(out.ok()) << out.status();
      double s = 0;
      for (int64_t i = 0; i < out->numel(); ++i) {
        s += static_cast<double>(out->f32()[i]) * r.f32()[i];
      }
      return s;
    };
    auto probe = [&](float* values, const float* analytic, int64_t n,
                     const std::string& what) {
      const int64_t step = std::max<int64_t>(1, n / probes);
      for (int64_t i = 0; i < n; i += step) {
        const float saved = values[i];
        values[i] = saved + eps;
        const double plus = loss();
        values[i] = saved - eps;
        const double minus = loss();
        values[i] = saved;
        const double numeric = (plus - minus) / (2.0 * eps);
        const double err = std::fabs(numeric - analytic[i]);
        EXPECT_LE(err, tol * std::max(1.0, std::fabs(numeric)))
            << what << "[" << i << "] numeric " << numeric << " analytic "
            << analytic[i];
      }
    };
    if (check_input) {
      ASSERT_EQ(dx->shape(), x->shape());
      probe(x->f32(), dx->f32(), x->numel(), "dx");
    }
    for (Param* p : layer->params()) {
      ASSERT_FALSE(p->grad_fresh) << p->name << " got no gradient";
      probe(p->value.f32(), p->grad.f32(), p->value.numel(), p->name);
    }
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
  ForwardOptions options_;
};

TEST_F(GradientCheck, Linear) {
  auto layer = Linear::Create(backend_.get(), 5, 4, true, 1);
  ASSERT_TRUE(layer.ok());
  Check(layer->get(), RandomHost({3, 5}, 1), true);
}

TEST_F(GradientCheck, LinearOnThreeDimensionalInput) {
  auto layer = Linear::Create(backend_.get(), 6, 3, false, 2);
  ASSERT_TRUE(layer.ok());
  Check(layer->get(), RandomHost({2, 3, 6}, 2), true);
}

TEST_F(GradientCheck, Relu) {
  Relu layer(backend_.get());
  // Keep inputs away from the kink at 0.
  Tensor x = RandomHost({4, 6}, 3, 0.1f, 1.0f);
  for (int64_t i = 0; i < x.numel(); i += 2) x.f32()[i] = -x.f32()[i];
  Check(&layer, x, true);
}

TEST_F(GradientCheck, Gelu) {
  Gelu layer(backend_.get());
  Check(&layer, RandomHost({4, 6}, 4, -3.0f, 3.0f), true);
}

TEST_F(GradientCheck, Dropout) {
  Dropout layer(backend_.get(), 0.3f, 17);
  Check(&layer, RandomHost({4, 8}, 5), true);
}

TEST_F(GradientCheck, DropoutIsIdentityWhenNotTraining) {
  Dropout layer(backend_.get(), 0.5f, 17);
  Tensor x = RandomHost({2, 8}, 6);
  ForwardOptions eval;
  eval.training = false;
  auto y = layer.Forward(x, eval, nullptr);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->ToVector(), x.ToVector());
}

TEST_F(GradientCheck, Flatten) {
  Flatten layer;
  Check(&layer, RandomHost({2, 3, 4}, 7), true);
}

TEST_F(GradientCheck, LayerNorm) {
  auto layer = LayerNorm::Create(backend_.get(), 8, 1e-5f);
  ASSERT_TRUE(layer.ok());
  // Non-trivial gamma and beta so their gradients matter.
  for (Param* p : (*layer)->params()) {
    Tensor v = RandomHost(p->value.shape(), 8, 0.5f, 1.5f);
    std::copy(v.f32(), v.f32() + v.numel(), p->value.f32());
  }
  Check(layer->get(), RandomHost({3, 8}, 9), true, 1e-2f, 3e-2);
}

TEST_F(GradientCheck, Embedding) {
  auto layer = Embedding::Create(backend_.get(), 7, 4, 5, 10);
  ASSERT_TRUE(layer.ok());
  Tensor ids = Tensor::HostFrom({2, 3}, {1, 6, 1, 0, 3, 6});
  Check(layer->get(), ids, false);
}

TEST_F(GradientCheck, EmbeddingRejectsOutOfVocabularyIds) {
  auto layer = Embedding::Create(backend_.get(), 7, 4, 5, 10);
  ASSERT_TRUE(layer.ok());
  Tensor ids = Tensor::HostFrom({1, 2}, {1, 7});
  auto y = (*layer)->Forward(ids, options_, nullptr);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GradientCheck, CausalSelfAttention) {
  auto layer = CausalSelfAttention::Create(backend_.get(), 8, 2, 11);
  ASSERT_TRUE(layer.ok());
  Check(layer->get(), RandomHost({2, 5, 8}, 12), true);
}

TEST_F(GradientCheck, AttentionIsCausal) {
  // Changing the last position must not change earlier outputs.
  auto layer = CausalSelfAttention::Create(backend_.get(), 8, 2, 11);
  ASSERT_TRUE(layer.ok());
  Tensor x = RandomHost({1, 4, 8}, 13);
  auto y1 = (*layer)->Forward(x, options_, nullptr);
  ASSERT_TRUE(y1.ok());
  std::vector<float> before = y1->ToVector();
  for (int c = 0; c < 8; ++c) x.f32()[3 * 8 + c] += 1.0f;
  auto y2 = (*layer)->Forward(x, options_, nullptr);
  ASSERT_TRUE(y2.ok());
  for (int i = 0; i < 3 * 8; ++i) EXPECT_FLOAT_EQ(y2->f32()[i], before[i]);
  EXPECT_NE(y2->f32()[3 * 8], before[3 * 8]);
}

TEST_F(GradientCheck, TransformerBlock) {
  auto layer = TransformerBlock::Create(backend_.get(), 8, 2, 16, 3, 0);
  ASSERT_TRUE(layer.ok());
  Check(layer->get(), RandomHost({2, 4, 8}, 14), true, 1e-2f, 3e-2);
}

TEST_F(GradientCheck, SoftmaxCrossEntropy) {
  SoftmaxCrossEntropyLoss loss(backend_.get());
  Tensor logits = RandomHost({4, 5}, 15, -2.0f, 2.0f);
  Tensor labels = Tensor::HostFrom({4}, {0, 4, 2, 2});
  LayerContext ctx;
  auto stats = loss.Forward(logits, labels, &ctx);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->rows, 4);
  const float scale = 0.25f;
  auto grad = loss.Backward(scale, &ctx);
  ASSERT_TRUE(grad.ok());
  const float eps = 1e-2f;
  for (int64_t i = 0; i < logits.numel(); ++i) {
    const float saved = logits.f32()[i];
    logits.f32()[i] = saved + eps;
    const double plus = loss.Forward(logits, labels, nullptr)->loss_sum;
    logits.f32()[i] = saved - eps;
    const double minus = loss.Forward(logits, labels, nullptr)->loss_sum;
    logits.f32()[i] = saved;
    EXPECT_NEAR(scale * (plus - minus) / (2 * eps), grad->f32()[i], 1e-3) << i;
  }
}

TEST_F(GradientCheck, LossCountsAccuracyAndRejectsBadLabels) {
  SoftmaxCrossEntropyLoss loss(backend_.get());
  Tensor logits = Tensor::HostFrom({2, 3}, {5, 0, 0, 0, 0, 5});
  auto stats = loss.Forward(logits, Tensor::HostFrom({2}, {0, 1}), nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_DOUBLE_EQ(stats->accuracy(), 0.5);
  EXPECT_EQ(loss.Forward(logits, Tensor::HostFrom({2}, {0, 3}), nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loss.Forward(logits, Tensor::HostFrom({3}, {0, 1, 2}), nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
