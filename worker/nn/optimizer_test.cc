#include "worker/nn/optimizer.h"

#include <cmath>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"

namespace pipetrain {
namespace {

class OptimizerTest : public ::testing::Test {
 protected:
  Param MakeScalarParam(float value, float grad) {
    Param p;
    p.name = "w";
    p.value = Tensor::HostFrom({1}, {value});
    p.grad = Tensor::HostFrom({1}, {grad});
    p.grad_fresh = false;
    return p;
  }
  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
};

TEST_F(OptimizerTest, SgdWithMomentumAndWeightDecay) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.1f);
  spec.mutable_sgd()->set_momentum(0.9f);
  spec.mutable_sgd()->set_weight_decay(0.01f);
  auto opt = Optimizer::Create(spec, backend_.get());
  ASSERT_TRUE(opt.ok());
  Param p = MakeScalarParam(1.0f, 0.5f);
  ASSERT_TRUE((*opt)->Step({&p}).ok());
  // g = 0.5 + 0.01 * 1 = 0.51; m = 0.51; w = 1 - 0.051.
  EXPECT_NEAR(p.value.f32()[0], 0.949f, 1e-6);
  EXPECT_TRUE(p.grad_fresh);
  p.grad.f32()[0] = 0.5f;
  p.grad_fresh = false;
  ASSERT_TRUE((*opt)->Step({&p}).ok());
  // g = 0.5 + 0.00949; m = 0.9 * 0.51 + g = 0.96849; w -= 0.096849.
  EXPECT_NEAR(p.value.f32()[0], 0.949f - 0.096849f, 1e-6);
}

TEST_F(OptimizerTest, FreshGradientsAreSkipped) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.1f);
  auto opt = Optimizer::Create(spec, backend_.get());
  ASSERT_TRUE(opt.ok());
  Param p = MakeScalarParam(1.0f, 0.5f);
  p.grad_fresh = true;
  ASSERT_TRUE((*opt)->Step({&p}).ok());
  EXPECT_EQ(p.value.f32()[0], 1.0f);
}

TEST_F(OptimizerTest, AdamWFirstStepMovesByLearningRate) {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.01f);
  spec.mutable_adamw()->set_weight_decay(0.1f);
  auto opt = Optimizer::Create(spec, backend_.get());
  ASSERT_TRUE(opt.ok());
  Param p = MakeScalarParam(2.0f, -3.0f);
  ASSERT_TRUE((*opt)->Step({&p}).ok());
  // Bias-corrected m/sqrt(v) = sign(g) on step 1; decay 0.01 * 0.1 * 2.
  EXPECT_NEAR(p.value.f32()[0], 2.0f + 0.01f - 0.002f, 1e-5);
}

// A step in parts (StartStep, then Update per group of parameters) is the
// step taken whole: the same bits over several AdamW steps, whose bias
// correction depends on the step count, for a parameter in each group.
TEST_F(OptimizerTest, AStepInPartsIsTheWholeStep) {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.01f);
  spec.mutable_adamw()->set_weight_decay(0.1f);
  auto whole = Optimizer::Create(spec, backend_.get());
  auto parts = Optimizer::Create(spec, backend_.get());
  ASSERT_TRUE(whole.ok() && parts.ok());
  Param a = MakeScalarParam(2.0f, -3.0f), b = MakeScalarParam(-1.0f, 0.25f);
  Param c = MakeScalarParam(2.0f, -3.0f), d = MakeScalarParam(-1.0f, 0.25f);
  const float grads[3][2] = {{-3.0f, 0.25f}, {1.5f, -0.5f}, {0.75f, 2.0f}};
  for (const auto& g : grads) {
    a.grad.f32()[0] = c.grad.f32()[0] = g[0];
    b.grad.f32()[0] = d.grad.f32()[0] = g[1];
    for (Param* p : {&a, &b, &c, &d}) p->grad_fresh = false;
    ASSERT_TRUE((*whole)->Step({&a, &b}).ok());
    (*parts)->StartStep();
    ASSERT_TRUE((*parts)->Update({&d}, 1.0f).ok());
    ASSERT_TRUE((*parts)->Update({&c}, 1.0f).ok());
    EXPECT_EQ(c.value.f32()[0], a.value.f32()[0]);
    EXPECT_EQ(d.value.f32()[0], b.value.f32()[0]);
    EXPECT_TRUE(c.grad_fresh && d.grad_fresh);
  }
  EXPECT_EQ((*parts)->steps(), 3);
  // The parameters moved: the comparison above compared updates.
  EXPECT_NE(c.value.f32()[0], 2.0f);
}

TEST_F(OptimizerTest, BadSpecsNameTheField) {
  v1::OptimizerSpec spec;
  EXPECT_EQ(Optimizer::Create(spec, backend_.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.mutable_sgd()->set_lr(-1);
  auto bad = Optimizer::Create(spec, backend_.get());
  EXPECT_NE(bad.status().message().find("sgd.lr"), std::string::npos);
  spec.mutable_adamw()->set_lr(0.1f);
  spec.mutable_adamw()->set_beta1(1.0f);
  bad = Optimizer::Create(spec, backend_.get());
  EXPECT_NE(bad.status().message().find("adamw.beta1"), std::string::npos);
}

TEST_F(OptimizerTest, ClippingScalesToTheMaximumNorm) {
  Param a = MakeScalarParam(0, 3.0f);
  Param b = MakeScalarParam(0, 4.0f);
  auto ss = GradSumSquares(backend_.get(), {&a, &b});
  ASSERT_TRUE(ss.ok());
  EXPECT_DOUBLE_EQ(*ss, 25.0);
  EXPECT_NEAR(ClipScale(*ss, 1.0f), 0.2f, 1e-6);
  EXPECT_EQ(ClipScale(*ss, 10.0f), 1.0f);
  EXPECT_EQ(ClipScale(*ss, 0.0f), 1.0f);
}

}  // namespace
}  // namespace pipetrain
