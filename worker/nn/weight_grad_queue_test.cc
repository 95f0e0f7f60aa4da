// Weight-gradient products held back and run together: a linear layer's
// gradients after the flush must be the sums over every micro-batch, as a
// plain double-precision loop computes them; nothing may reach the
// gradients before the flush (or the row target), and discarded products
// never reach them.
#include "worker/nn/weight_grad_queue.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"
#include "worker/nn/model.h"

namespace pipetrain {
namespace {

constexpr int64_t kIn = 5;
constexpr int64_t kOut = 3;

Tensor RandomHost(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::Host(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] = -1.0f + 2.0f * math::UniformAt(seed, i);
  }
  return t;
}

class WeightGradQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto layer = Linear::Create(backend_.get(), kIn, kOut, true, 7);
    ASSERT_TRUE(layer.ok()) << layer.status();
    linear_ = std::move(*layer);
    linear_->DeferWeightGrads(&queue_);
    ZeroGrads(linear_->params());
  }

  // Forward and backward of one micro-batch of `rows` rows; remembers its
  // x and dy for the reference.
  void RunMicroBatch(int64_t rows, uint64_t seed) {
    const Tensor x = RandomHost({rows, kIn}, seed);
    const Tensor dy = RandomHost({rows, kOut}, seed + 100);
    LayerContext ctx;
    ASSERT_TRUE(linear_->Forward(x, ForwardOptions(), &ctx).ok());
    auto dx = linear_->Backward(dy, ForwardOptions(), &ctx, true);
    ASSERT_TRUE(dx.ok()) << dx.status();
    xs_.push_back(x);
    dys_.push_back(dy);
  }

  // dW[i][j] = sum over rows of x[r][i] dy[r][j] (W is stored [in, out]);
  // db[j] = sum over rows of dy[r][j].
  void ExpectGradientsAreTheSums() {
    std::vector<double> dw(kIn * kOut, 0.0), db(kOut, 0.0);
    for (size_t m = 0; m < xs_.size(); ++m) {
      const int64_t rows = xs_[m].numel() / kIn;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < kOut; ++j) {
          const double g = dys_[m].f32()[r * kOut + j];
          db[j] += g;
          for (int64_t i = 0; i < kIn; ++i) {
            dw[i * kOut + j] += xs_[m].f32()[r * kIn + i] * g;
          }
        }
      }
    }
    const std::vector<Param*> params = linear_->params();
    ASSERT_EQ(params.size(), 2u);
    ASSERT_FALSE(params[0]->grad_fresh);
    ASSERT_FALSE(params[1]->grad_fresh);
    const std::vector<float> got_w = params[0]->grad.ToVector();
    const std::vector<float> got_b = params[1]->grad.ToVector();
    for (size_t i = 0; i < dw.size(); ++i) {
      EXPECT_NEAR(got_w[i], dw[i], 1e-5 * (1.0 + std::fabs(dw[i]))) << i;
    }
    for (size_t j = 0; j < db.size(); ++j) {
      EXPECT_NEAR(got_b[j], db[j], 1e-5 * (1.0 + std::fabs(db[j]))) << j;
    }
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
  WeightGradQueue queue_{backend_.get()};
  std::unique_ptr<Linear> linear_;
  std::vector<Tensor> xs_;
  std::vector<Tensor> dys_;
};

TEST_F(WeightGradQueueTest, GradientsArriveAtTheFlushAsTheSumOverMicroBatches) {
  RunMicroBatch(4, 1);
  RunMicroBatch(7, 2);
  RunMicroBatch(1, 3);
  // Held: nothing has reached the gradients yet.
  for (Param* p : linear_->params()) EXPECT_TRUE(p->grad_fresh);
  EXPECT_EQ(queue_.held_bytes(), (12 * kIn + 12 * kOut) * 4);
  ASSERT_TRUE(queue_.Flush().ok());
  EXPECT_EQ(queue_.held_bytes(), 0);
  ExpectGradientsAreTheSums();
  // A second flush adds nothing.
  const std::vector<float> before = linear_->params()[0]->grad.ToVector();
  ASSERT_TRUE(queue_.Flush().ok());
  EXPECT_EQ(linear_->params()[0]->grad.ToVector(), before);
}

TEST_F(WeightGradQueueTest, RowsPastTheLimitRunWhatIsHeldFirst) {
  constexpr int64_t kHalf = WeightGradQueue::kMaxRows / 2;
  RunMicroBatch(kHalf, 1);
  RunMicroBatch(kHalf, 2);
  // At the limit: still held.
  for (Param* p : linear_->params()) EXPECT_TRUE(p->grad_fresh);
  EXPECT_EQ(queue_.held_bytes(), 2 * kHalf * (kIn + kOut) * 4);
  // Three more rows would pass it: the held rows run, the new ones wait.
  RunMicroBatch(3, 3);
  EXPECT_EQ(queue_.held_bytes(), 3 * (kIn + kOut) * 4);
  for (Param* p : linear_->params()) EXPECT_FALSE(p->grad_fresh);
  ASSERT_TRUE(queue_.Flush().ok());
  ExpectGradientsAreTheSums();
}

// Holding copies each micro-batch into the layer's stacks, which later
// steps reuse: the second step's holding allocates nothing, and a caller
// changing its tensors after handing them over changes nothing held.
TEST_F(WeightGradQueueTest, TheStacksAreKeptFromOneStepToTheNext) {
  for (int step = 0; step < 2; ++step) {
    RunMicroBatch(4, 10 * step + 1);
    RunMicroBatch(4, 10 * step + 2);
    RunMicroBatch(4, 10 * step + 3);
    EXPECT_EQ(queue_.stack_bytes(), 16 * (kIn + kOut) * 4) << step;
    // The caller's copies move on; the queue's do not.
    for (Tensor& x : xs_) {
      Tensor moved = Tensor::Host(x.shape());
      std::copy(x.f32(), x.f32() + x.numel(), moved.f32());
      for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 1e6f;
      x = moved;
    }
    ZeroGrads(linear_->params());
    ASSERT_TRUE(queue_.Flush().ok());
    ExpectGradientsAreTheSums();
    xs_.clear();
    dys_.clear();
  }
}

// The profiler's repetition: the held rows again, as a step of `times`
// micro-batches would bring them, up to the row limit.
TEST_F(WeightGradQueueTest, RepeatHoldsTheRowsAgainUpToTheLimit) {
  RunMicroBatch(WeightGradQueue::kMaxRows / 4, 1);
  auto times = queue_.Repeat(8);
  ASSERT_TRUE(times.ok()) << times.status();
  EXPECT_EQ(*times, 4);
  EXPECT_EQ(queue_.held_bytes(), WeightGradQueue::kMaxRows * (kIn + kOut) * 4);
  const Tensor x = xs_[0];
  const Tensor dy = dys_[0];
  for (int i = 1; i < 4; ++i) {
    xs_.push_back(x);
    dys_.push_back(dy);
  }
  ASSERT_TRUE(queue_.Flush().ok());
  ExpectGradientsAreTheSums();
}

TEST_F(WeightGradQueueTest, AMicroBatchOfTheLimitOrMoreIsNotHeld) {
  RunMicroBatch(2, 1);
  RunMicroBatch(WeightGradQueue::kMaxRows, 2);
  EXPECT_EQ(queue_.held_bytes(), 0);
  ExpectGradientsAreTheSums();
}

TEST_F(WeightGradQueueTest, DiscardedProductsNeverReachTheGradients) {
  RunMicroBatch(4, 1);
  queue_.Discard();
  EXPECT_EQ(queue_.held_bytes(), 0);
  ASSERT_TRUE(queue_.Flush().ok());
  for (Param* p : linear_->params()) EXPECT_TRUE(p->grad_fresh);
  xs_.clear();
  dys_.clear();
  RunMicroBatch(2, 5);
  ASSERT_TRUE(queue_.Flush().ok());
  ExpectGradientsAreTheSums();
}

// A second layer on the same queue: flushing the first by its params runs
// only its products; the second's stay held until they are named.
TEST_F(WeightGradQueueTest, FlushForRunsOnlyTheNamedLayersProducts) {
  auto other = Linear::Create(backend_.get(), kOut, kIn, true, 8);
  ASSERT_TRUE(other.ok()) << other.status();
  (*other)->DeferWeightGrads(&queue_);
  ZeroGrads((*other)->params());
  RunMicroBatch(4, 1);
  RunMicroBatch(2, 2);
  const Tensor x = RandomHost({3, kOut}, 30);
  const Tensor dy = RandomHost({3, kIn}, 31);
  LayerContext ctx;
  ASSERT_TRUE((*other)->Forward(x, ForwardOptions(), &ctx).ok());
  ASSERT_TRUE((*other)->Backward(dy, ForwardOptions(), &ctx, true).ok());
  const int64_t other_bytes = 3 * (kOut + kIn) * 4;
  EXPECT_EQ(queue_.held_bytes(), 6 * (kIn + kOut) * 4 + other_bytes);

  ASSERT_TRUE(queue_.FlushFor(linear_->params()).ok());
  ExpectGradientsAreTheSums();
  for (Param* p : (*other)->params()) EXPECT_TRUE(p->grad_fresh);
  EXPECT_EQ(queue_.held_bytes(), other_bytes);

  ASSERT_TRUE(queue_.FlushFor((*other)->params()).ok());
  EXPECT_EQ(queue_.held_bytes(), 0);
  // The other layer's dW[i][j] = sum over rows of x[r][i] dy[r][j].
  const std::vector<float> got = (*other)->params()[0]->grad.ToVector();
  for (int64_t i = 0; i < kOut; ++i) {
    for (int64_t j = 0; j < kIn; ++j) {
      double want = 0;
      for (int64_t r = 0; r < 3; ++r) {
        want +=
            static_cast<double>(x.f32()[r * kOut + i]) * dy.f32()[r * kIn + j];
      }
      EXPECT_NEAR(got[i * kIn + j], want, 1e-5 * (1.0 + std::fabs(want)));
    }
  }
  // The first layer's gradients did not move again.
  ExpectGradientsAreTheSums();
}

TEST_F(WeightGradQueueTest, RowsOfTheWrongWidthAreRefused) {
  auto accumulate = [](const Tensor&, const Tensor&, int64_t,
                       bool) -> absl::StatusOr<bool> { return true; };
  const Tensor x = RandomHost({2, kIn}, 1);
  EXPECT_EQ(
      queue_.Add(this, kIn, kOut, x, RandomHost({2, kOut + 1}, 2), accumulate)
          .code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      queue_.Add(this, kIn, kOut, x, RandomHost({2, kOut}, 2), accumulate)
          .ok());
  // The same owner with another shape.
  EXPECT_EQ(queue_
                .Add(this, kOut, kIn, RandomHost({2, kOut}, 3),
                     RandomHost({2, kIn}, 4), accumulate)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A model deferring its products ends a step of four micro-batches with
// the gradients of the same model run without deferring (same sums,
// rounded in another order).
TEST(WeightGradQueueModelTest, ADeferringModelEndsTheStepWithTheSameGradients) {
  v1::ModelSpec spec;
  spec.add_input_shape(6);
  spec.set_input_kind(v1::INPUT_KIND_FLOAT);
  spec.set_loss(v1::LOSS_KIND_SOFTMAX_CROSS_ENTROPY);
  const int widths[] = {6, 8, 4};
  for (int i = 0; i < 2; ++i) {
    auto* linear = spec.add_layers()->mutable_linear();
    linear->set_in_features(widths[i]);
    linear->set_out_features(widths[i + 1]);
    if (i == 0) spec.add_layers()->mutable_relu();
  }
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  std::vector<std::unique_ptr<Model>> models;
  for (int i = 0; i < 2; ++i) {
    auto model = Model::Build(spec, 0, 3, backend.get(), 11);
    ASSERT_TRUE(model.ok()) << model.status();
    models.push_back(std::move(*model));
    ZeroGrads(models.back()->params());
  }
  models[1]->DeferWeightGrads(true);
  for (int mb = 0; mb < 4; ++mb) {
    const Tensor x = RandomHost({3, 6}, 20 + mb);
    const Tensor dy = RandomHost({3, 4}, 40 + mb);
    for (auto& model : models) {
      std::vector<LayerContext> contexts;
      ASSERT_TRUE(model->Forward(x, ForwardOptions(), &contexts).ok());
      ASSERT_TRUE(model->Backward(dy, ForwardOptions(), &contexts, false).ok());
    }
  }
  EXPECT_GT(models[1]->deferred_weight_grad_bytes(), 0);
  for (Param* p : models[1]->params()) EXPECT_TRUE(p->grad_fresh);
  ASSERT_TRUE(models[1]->FlushWeightGrads().ok());
  EXPECT_EQ(models[1]->deferred_weight_grad_bytes(), 0);
  const std::vector<Param*> want = models[0]->params();
  const std::vector<Param*> got = models[1]->params();
  ASSERT_EQ(want.size(), got.size());
  for (size_t p = 0; p < want.size(); ++p) {
    const std::vector<float> a = want[p]->grad.ToVector();
    const std::vector<float> b = got[p]->grad.ToVector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i], a[i], 1e-5f * (1.0f + std::fabs(a[i])))
          << want[p]->name << "[" << i << "]";
    }
  }
}

// Rows run ahead of the flush (RunAhead) must leave the flush with the
// bits of the one product over every row, as a queue that only flushes
// gives them: twice ahead (the second carrying the first's sums on), then
// the flush, against a queue that only flushes, on layers 256 wide. Where
// the backend cannot resume sums (a CPU without AVX-512), the layer
// declines and the rows wait for the flush.
TEST(WeightGradQueueRunAheadTest, RowsRunAheadGiveTheFlushTheBitsOfOneProduct) {
  constexpr int64_t kWide = 256, kRows = 32;
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  const bool resumes = backend->ResumesSums(true, false, kWide, kWide,
                                            WeightGradQueue::kMaxRows);
  WeightGradQueue plain(backend.get()), ahead(backend.get());
  std::vector<std::unique_ptr<Linear>> layers;
  for (WeightGradQueue* queue : {&plain, &ahead}) {
    auto layer = Linear::Create(backend.get(), kWide, kWide, true, 7);
    ASSERT_TRUE(layer.ok()) << layer.status();
    (*layer)->DeferWeightGrads(queue);
    ZeroGrads((*layer)->params());
    layers.push_back(std::move(*layer));
  }
  for (int mb = 0; mb < 8; ++mb) {
    const Tensor x = RandomHost({kRows, kWide}, 20 + mb);
    const Tensor dy = RandomHost({kRows, kWide}, 40 + mb);
    for (auto& layer : layers) {
      LayerContext ctx;
      ASSERT_TRUE(layer->Forward(x, ForwardOptions(), &ctx).ok());
      ASSERT_TRUE(layer->Backward(dy, ForwardOptions(), &ctx, true).ok());
    }
    if (mb == 2 || mb == 5) {
      // Not enough rows left to run: nothing runs.
      auto none = ahead.RunAhead(4 * kRows);
      ASSERT_TRUE(none.ok()) << none.status();
      EXPECT_FALSE(*none);
      const int64_t held = ahead.held_bytes();
      auto ran = ahead.RunAhead(2 * kRows);
      ASSERT_TRUE(ran.ok()) << ran.status();
      EXPECT_EQ(*ran, resumes) << "after micro-batch " << mb;
      // The rows stay held (the bias sums them at the flush).
      EXPECT_EQ(ahead.held_bytes(), held);
      EXPECT_EQ(layers[1]->params()[0]->grad_fresh, !resumes);
      EXPECT_TRUE(layers[1]->params()[1]->grad_fresh);
      // Nothing may repeat rows that ran ahead.
      if (resumes) {
        EXPECT_EQ(ahead.Repeat(2).status().code(),
                  absl::StatusCode::kFailedPrecondition);
      }
    }
  }
  if (resumes) {
    // Every held row has run ahead once: nothing is left to run again.
    auto again = ahead.RunAhead(0);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(*again);  // micro-batches 6 and 7
    again = ahead.RunAhead(0);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(*again);
  }
  ASSERT_TRUE(plain.Flush().ok());
  ASSERT_TRUE(ahead.Flush().ok());
  EXPECT_EQ(ahead.held_bytes(), 0);
  EXPECT_EQ(ahead.run_bytes(), plain.run_bytes());
  const std::vector<Param*> want = layers[0]->params();
  const std::vector<Param*> got = layers[1]->params();
  ASSERT_EQ(want.size(), 2u);
  for (size_t p = 0; p < want.size(); ++p) {
    EXPECT_EQ(got[p]->grad.ToVector(), want[p]->grad.ToVector())
        << want[p]->name;
  }
}

// A gradient already holding a sum (an earlier run of rows past the limit)
// cannot take rows ahead exactly, so the layer declines; and the small
// layers of the fixture decline on any backend. Either way the flush gives
// the sums.
TEST_F(WeightGradQueueTest, RowsAreNotRunAheadWhereTheSumCouldNotBeResumed) {
  RunMicroBatch(4, 1);
  RunMicroBatch(3, 2);
  auto ran = queue_.RunAhead(1);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_FALSE(*ran);
  for (Param* p : linear_->params()) EXPECT_TRUE(p->grad_fresh);
  ASSERT_TRUE(queue_.Flush().ok());
  ExpectGradientsAreTheSums();

  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  WeightGradQueue queue(backend.get());
  auto layer = Linear::Create(backend.get(), 256, 256, false, 7);
  ASSERT_TRUE(layer.ok()) << layer.status();
  (*layer)->DeferWeightGrads(&queue);
  ZeroGrads((*layer)->params());
  for (int mb = 0; mb < 3; ++mb) {
    LayerContext ctx;
    const Tensor x = RandomHost({128, 256}, 60 + mb);
    ASSERT_TRUE((*layer)->Forward(x, ForwardOptions(), &ctx).ok());
    ASSERT_TRUE((*layer)
                    ->Backward(RandomHost({128, 256}, 70 + mb),
                               ForwardOptions(), &ctx, true)
                    .ok());
  }
  // The third micro-batch ran the first two (256 rows) into the gradient.
  EXPECT_FALSE((*layer)->params()[0]->grad_fresh);
  ran = queue.RunAhead(1);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_FALSE(*ran);
  EXPECT_EQ(queue.held_bytes(), 128 * (256 + 256) * 4);
}

}  // namespace
}  // namespace pipetrain
