// Every layer, the loss and an optimizer step on the CUDA backend against the
// CPU reference. Labelled `gpu`; skips where no GPU is visible and fails
// where one is visible but CUDA cannot use it (gpu_test_gate.h).
#include <cmath>
#include <functional>

#include "gtest/gtest.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/compute/gpu_test_gate.h"
#include "worker/nn/layers.h"
#include "worker/nn/loss.h"
#include "worker/nn/optimizer.h"

namespace pipetrain {
namespace {

using LayerFactory =
    std::function<absl::StatusOr<std::unique_ptr<Layer>>(Backend*)>;

Tensor RandomHost(const Shape& shape, uint64_t seed, float lo = -1.0f,
                  float hi = 1.0f) {
  Tensor t = Tensor::Host(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] = lo + (hi - lo) * math::UniformAt(seed, i);
  }
  return t;
}

void ExpectClose(Backend* backend, const Tensor& device, const Tensor& want,
                 const std::string& what, double tol = 1e-4) {
  auto got = ToHost(backend, device);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.f32()[i];
    ASSERT_NEAR(got->f32()[i], w, tol * std::max(1.0, std::fabs(w)))
        << what << "[" << i << "]";
  }
}

class LayerParity : public ::testing::Test {
 protected:
  void SetUp() override {
    PT_GPU_TEST_REQUIRE_CUDA();
    BackendOptions options;
    options.kind = BackendKind::kCuda;
    auto cuda = CreateBackend(options);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = std::move(*cuda);
  }

  // Forward and backward of the same layer on both backends.
  void Check(const LayerFactory& make, const Tensor& x_host, bool need_dx) {
    auto cpu_layer = make(cpu_.get());
    auto gpu_layer = make(cuda_.get());
    ASSERT_TRUE(cpu_layer.ok() && gpu_layer.ok());
    ForwardOptions options;
    options.dropout_seed = 5;
    LayerContext cpu_ctx, gpu_ctx;
    auto x_gpu = ToDevice(cuda_.get(), x_host);
    ASSERT_TRUE(x_gpu.ok());
    auto y_cpu = (*cpu_layer)->Forward(x_host, options, &cpu_ctx);
    auto y_gpu = (*gpu_layer)->Forward(*x_gpu, options, &gpu_ctx);
    ASSERT_TRUE(y_cpu.ok() && y_gpu.ok()) << y_gpu.status();
    ExpectClose(cuda_.get(), *y_gpu, *y_cpu, "y");
    const Tensor dy = RandomHost(y_cpu->shape(), 77);
    auto dy_gpu = ToDevice(cuda_.get(), dy);
    ASSERT_TRUE(dy_gpu.ok());
    auto dx_cpu = (*cpu_layer)->Backward(dy, options, &cpu_ctx, need_dx);
    auto dx_gpu = (*gpu_layer)->Backward(*dy_gpu, options, &gpu_ctx, need_dx);
    ASSERT_TRUE(dx_cpu.ok() && dx_gpu.ok()) << dx_gpu.status();
    if (need_dx) ExpectClose(cuda_.get(), *dx_gpu, *dx_cpu, "dx");
    const auto cpu_params = (*cpu_layer)->params();
    const auto gpu_params = (*gpu_layer)->params();
    ASSERT_EQ(cpu_params.size(), gpu_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      ExpectClose(cuda_.get(), gpu_params[i]->value, cpu_params[i]->value,
                  cpu_params[i]->name + " value");
      ExpectClose(cuda_.get(), gpu_params[i]->grad, cpu_params[i]->grad,
                  cpu_params[i]->name + " grad", 2e-4);
    }
  }

  std::unique_ptr<Backend> cpu_ = CreateCpuBackend(1);
  std::unique_ptr<Backend> cuda_;
};

TEST_F(LayerParity, Linear) {
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return Linear::Create(b, 37, 45, true, 3);
      },
      RandomHost({19, 37}, 1), true);
}

TEST_F(LayerParity, ReluGeluDropoutFlatten) {
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return std::unique_ptr<Layer>(new Relu(b));
      },
      RandomHost({7, 33}, 2), true);
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return std::unique_ptr<Layer>(new Gelu(b));
      },
      RandomHost({7, 33}, 3, -4, 4), true);
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return std::unique_ptr<Layer>(new Dropout(b, 0.3f, 9));
      },
      RandomHost({7, 1000}, 4), true);
  Check(
      [](Backend*) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return std::unique_ptr<Layer>(new Flatten());
      },
      RandomHost({3, 4, 5}, 5), true);
}

TEST_F(LayerParity, LayerNorm) {
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return LayerNorm::Create(b, 100, 1e-5f);
      },
      RandomHost({13, 100}, 6, -3, 5), true);
}

TEST_F(LayerParity, Embedding) {
  Tensor ids = Tensor::Host({4, 9});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.f32()[i] = (i * 7) % 50;
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return Embedding::Create(b, 50, 24, 16, 4);
      },
      ids, false);
}

TEST_F(LayerParity, CausalSelfAttention) {
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return CausalSelfAttention::Create(b, 32, 4, 8);
      },
      RandomHost({3, 17, 32}, 7), true);
}

TEST_F(LayerParity, TransformerBlock) {
  Check(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        return TransformerBlock::Create(b, 32, 4, 64, 9, 2);
      },
      RandomHost({2, 11, 32}, 8), true);
}

TEST_F(LayerParity, LossAndOptimizers) {
  const Tensor logits = RandomHost({21, 10}, 9, -3, 3);
  Tensor labels = Tensor::Host({21});
  for (int i = 0; i < 21; ++i) labels.f32()[i] = (i * 3) % 10;
  SoftmaxCrossEntropyLoss cpu_loss(cpu_.get()), gpu_loss(cuda_.get());
  LayerContext cpu_ctx, gpu_ctx;
  auto cpu_stats = cpu_loss.Forward(logits, labels, &cpu_ctx);
  auto gpu_stats = gpu_loss.Forward(*ToDevice(cuda_.get(), logits),
                                    *ToDevice(cuda_.get(), labels), &gpu_ctx);
  ASSERT_TRUE(cpu_stats.ok() && gpu_stats.ok()) << gpu_stats.status();
  EXPECT_NEAR(gpu_stats->loss_sum, cpu_stats->loss_sum,
              1e-4 * cpu_stats->loss_sum);
  EXPECT_EQ(gpu_stats->correct, cpu_stats->correct);
  ExpectClose(cuda_.get(), *gpu_loss.Backward(0.5f, &gpu_ctx),
              *cpu_loss.Backward(0.5f, &cpu_ctx), "dlogits");

  for (int kind = 0; kind < 2; ++kind) {
    v1::OptimizerSpec spec;
    if (kind == 0) {
      spec.mutable_sgd()->set_lr(0.1f);
      spec.mutable_sgd()->set_momentum(0.9f);
      spec.mutable_sgd()->set_weight_decay(0.01f);
    } else {
      spec.mutable_adamw()->set_lr(0.01f);
      spec.mutable_adamw()->set_weight_decay(0.1f);
    }
    auto cpu_opt = Optimizer::Create(spec, cpu_.get());
    auto gpu_opt = Optimizer::Create(spec, cuda_.get());
    ASSERT_TRUE(cpu_opt.ok() && gpu_opt.ok());
    Param cpu_p{"w", RandomHost({1000}, 10), RandomHost({1000}, 11), false};
    Param gpu_p{"w", *ToDevice(cuda_.get(), cpu_p.value),
                *ToDevice(cuda_.get(), cpu_p.grad), false};
    for (int step = 0; step < 3; ++step) {
      cpu_p.grad_fresh = gpu_p.grad_fresh = false;
      ASSERT_TRUE((*cpu_opt)->Step({&cpu_p}, 0.7f).ok());
      ASSERT_TRUE((*gpu_opt)->Step({&gpu_p}, 0.7f).ok());
    }
    ExpectClose(cuda_.get(), gpu_p.value, cpu_p.value, "optimizer", 1e-5);
  }
}

}  // namespace
}  // namespace pipetrain
