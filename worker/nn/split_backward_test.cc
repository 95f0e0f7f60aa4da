// The split backward of zero-bubble schedules: B (BackwardInput) then W
// (BackwardWeight) must leave exactly the dx and parameter gradients of the
// full Backward, for every layer and for a model, including gradients
// accumulated over two micro-batches whose B passes both run before their
// W passes (as ZB-H1 orders them). Bitwise equal on the CPU backend: both
// paths run the same kernels on the same operands in the same order.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"
#include "worker/nn/model.h"

namespace pipetrain {
namespace {

constexpr int kMicroBatches = 2;

Tensor RandomHost(const Shape& shape, uint64_t seed, float lo = -1.0f,
                  float hi = 1.0f) {
  Tensor t = Tensor::Host(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] = lo + (hi - lo) * math::UniformAt(seed, i);
  }
  return t;
}

// Bitwise comparison, so -0.0 vs 0.0 or a last-bit difference fails.
void ExpectBitwiseEqual(const Tensor& want, const Tensor& got,
                        const std::string& what) {
  ASSERT_EQ(want.empty(), got.empty()) << what;
  if (want.empty()) return;
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const std::vector<float> a = want.ToVector();
  const std::vector<float> b = got.ToVector();
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], sizeof(ua));
    std::memcpy(&ub, &b[i], sizeof(ub));
    ASSERT_EQ(ua, ub) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

// Gives non-trivial values to every parameter (e.g. LayerNorm's gamma = 1,
// beta = 0), the same for both copies of a layer.
void Randomize(const std::vector<Param*>& params) {
  uint64_t seed = 1000;
  for (Param* p : params) {
    const Tensor v = RandomHost(p->value.shape(), seed++, -0.8f, 0.8f);
    std::memcpy(p->value.raw(), v.raw(), v.bytes());
  }
}

// Runs two micro-batches through `full` with Backward and through `split`
// (an identical copy) with F0 F1 B0 B1 W0 W1, then compares each dx and
// every accumulated parameter gradient. `backward` and the split passes
// are injected so the same driver serves layers and models.
struct Pass {
  std::function<absl::StatusOr<Tensor>(const Tensor&, const ForwardOptions&,
                                       std::vector<LayerContext>*)>
      forward;
  std::function<absl::StatusOr<Tensor>(const Tensor&, const ForwardOptions&,
                                       std::vector<LayerContext>*, bool)>
      backward;
  std::function<absl::StatusOr<Tensor>(const Tensor&, const ForwardOptions&,
                                       std::vector<LayerContext>*, bool)>
      backward_input;
  std::function<absl::Status(const ForwardOptions&, std::vector<LayerContext>*)>
      backward_weight;
  std::vector<Param*> params;
};

Pass LayerPass(Layer* layer) {
  Pass p;
  p.forward = [layer](const Tensor& x, const ForwardOptions& o,
                      std::vector<LayerContext>* c) {
    c->resize(1);
    return layer->Forward(x, o, &(*c)[0]);
  };
  p.backward = [layer](const Tensor& dy, const ForwardOptions& o,
                       std::vector<LayerContext>* c, bool need_dx) {
    return layer->Backward(dy, o, &(*c)[0], need_dx);
  };
  p.backward_input = [layer](const Tensor& dy, const ForwardOptions& o,
                             std::vector<LayerContext>* c, bool need_dx) {
    return layer->BackwardInput(dy, o, &(*c)[0], need_dx);
  };
  p.backward_weight = [layer](const ForwardOptions& o,
                              std::vector<LayerContext>* c) {
    return layer->BackwardWeight(o, &(*c)[0]);
  };
  p.params = layer->params();
  return p;
}

Pass ModelPass(Model* model) {
  Pass p;
  p.forward = [model](const Tensor& x, const ForwardOptions& o,
                      std::vector<LayerContext>* c) {
    return model->Forward(x, o, c);
  };
  p.backward = [model](const Tensor& dy, const ForwardOptions& o,
                       std::vector<LayerContext>* c, bool need_dx) {
    return model->Backward(dy, o, c, need_dx);
  };
  p.backward_input = [model](const Tensor& dy, const ForwardOptions& o,
                             std::vector<LayerContext>* c, bool need_dx) {
    return model->BackwardInput(dy, o, c, need_dx);
  };
  p.backward_weight = [model](const ForwardOptions& o,
                              std::vector<LayerContext>* c) {
    return model->BackwardWeight(o, c);
  };
  p.params = model->params();
  return p;
}

// `inputs[m]` is micro-batch m's input; need_dx as the executor passes it.
void ExpectSplitMatchesFull(Pass full, Pass split,
                            const std::vector<Tensor>& inputs, bool need_dx) {
  ASSERT_EQ(full.params.size(), split.params.size());
  ForwardOptions options[kMicroBatches];
  for (int m = 0; m < kMicroBatches; ++m) options[m].dropout_seed = 7 + m;

  std::vector<Tensor> want_dx, dys;
  ZeroGrads(full.params);
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<LayerContext> ctx;
    auto y = full.forward(inputs[m], options[m], &ctx);
    ASSERT_TRUE(y.ok()) << y.status();
    dys.push_back(RandomHost(y->shape(), 500 + m));
    auto dx = full.backward(dys[m], options[m], &ctx, need_dx);
    ASSERT_TRUE(dx.ok()) << dx.status();
    want_dx.push_back(*dx);
  }

  ZeroGrads(split.params);
  std::vector<LayerContext> ctx[kMicroBatches];
  for (int m = 0; m < kMicroBatches; ++m) {
    auto y = split.forward(inputs[m], options[m], &ctx[m]);
    ASSERT_TRUE(y.ok()) << y.status();
  }
  for (int m = 0; m < kMicroBatches; ++m) {
    auto dx = split.backward_input(dys[m], options[m], &ctx[m], need_dx);
    ASSERT_TRUE(dx.ok()) << dx.status();
    ExpectBitwiseEqual(want_dx[m], *dx,
                       "dx of micro-batch " + std::to_string(m));
  }
  for (int m = 0; m < kMicroBatches; ++m) {
    const absl::Status status = split.backward_weight(options[m], &ctx[m]);
    ASSERT_TRUE(status.ok()) << status;
  }
  for (size_t i = 0; i < full.params.size(); ++i) {
    ASSERT_FALSE(split.params[i]->grad_fresh)
        << split.params[i]->name << " got no gradient";
    ExpectBitwiseEqual(full.params[i]->grad, split.params[i]->grad,
                       split.params[i]->name);
  }
}

class SplitBackward : public ::testing::Test {
 protected:
  // Builds two identical layers with `make` and compares them.
  template <typename MakeFn>
  void CheckLayer(MakeFn make, const Shape& input_shape, bool need_dx = true) {
    auto full = make();
    auto split = make();
    Randomize(full->params());
    Randomize(split->params());
    std::vector<Tensor> inputs;
    for (int m = 0; m < kMicroBatches; ++m) {
      inputs.push_back(RandomHost(input_shape, 40 + m));
    }
    ExpectSplitMatchesFull(LayerPass(full.get()), LayerPass(split.get()),
                           inputs, need_dx);
  }

  Backend* backend() { return backend_.get(); }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
};

template <typename T>
std::unique_ptr<T> Unwrap(absl::StatusOr<std::unique_ptr<T>> layer) {
  EXPECT_TRUE(layer.ok()) << layer.status();
  return layer.ok() ? std::move(*layer) : nullptr;
}

TEST_F(SplitBackward, Linear) {
  CheckLayer([&] { return Unwrap(Linear::Create(backend(), 5, 4, true, 1)); },
             {3, 5});
  // No bias, 3-D input, and no dx (a stage's first layer on stage 0).
  CheckLayer([&] { return Unwrap(Linear::Create(backend(), 6, 3, false, 2)); },
             {2, 3, 6});
  CheckLayer([&] { return Unwrap(Linear::Create(backend(), 5, 4, true, 3)); },
             {3, 5}, /*need_dx=*/false);
}

TEST_F(SplitBackward, ParameterFreeLayers) {
  CheckLayer([&] { return std::make_unique<Relu>(backend()); }, {4, 6});
  CheckLayer([&] { return std::make_unique<Gelu>(backend()); }, {4, 6});
  CheckLayer([&] { return std::make_unique<Dropout>(backend(), 0.3f, 17); },
             {4, 8});
  CheckLayer([&] { return std::make_unique<Flatten>(); }, {2, 3, 4});
}

TEST_F(SplitBackward, LayerNorm) {
  CheckLayer([&] { return Unwrap(LayerNorm::Create(backend(), 8, 1e-5f)); },
             {3, 8});
}

TEST_F(SplitBackward, Embedding) {
  auto make = [&] { return Unwrap(Embedding::Create(backend(), 7, 4, 5, 10)); };
  auto full = make();
  auto split = make();
  const std::vector<Tensor> ids = {
      Tensor::HostFrom({2, 3}, {1, 6, 1, 0, 3, 6}),
      Tensor::HostFrom({2, 3}, {2, 2, 5, 6, 0, 1})};
  ExpectSplitMatchesFull(LayerPass(full.get()), LayerPass(split.get()), ids,
                         /*need_dx=*/false);
}

TEST_F(SplitBackward, CausalSelfAttention) {
  CheckLayer(
      [&] { return Unwrap(CausalSelfAttention::Create(backend(), 8, 2, 11)); },
      {2, 5, 8});
}

TEST_F(SplitBackward, TransformerBlock) {
  CheckLayer(
      [&] {
        return Unwrap(TransformerBlock::Create(backend(), 8, 2, 16, 3, 0));
      },
      {2, 4, 8});
}

TEST_F(SplitBackward, WeightPassWithoutInputPassIsRejected) {
  auto layer = Unwrap(Linear::Create(backend(), 5, 4, true, 1));
  LayerContext ctx;
  ASSERT_TRUE(layer->Forward(RandomHost({3, 5}, 1), {}, &ctx).ok());
  EXPECT_EQ(layer->BackwardWeight({}, &ctx).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SplitBackward, InputPassKeepsOnlyWhatTheWeightPassNeeds) {
  // Attention's B drops qkv and the probabilities; a ReLU's B drops its
  // output; a Linear keeps x and dy for W and drops them after W.
  auto attn = Unwrap(CausalSelfAttention::Create(backend(), 8, 2, 11));
  LayerContext ctx;
  auto y = attn->Forward(RandomHost({2, 5, 8}, 3), {}, &ctx);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(ctx.saved.size(), 2u);
  ASSERT_TRUE(attn->BackwardInput(*y, {}, &ctx, true).ok());
  EXPECT_TRUE(ctx.saved.empty());
  ASSERT_EQ(ctx.children.size(), 2u);
  EXPECT_EQ(ctx.children[0].saved.size(), 2u);
  ASSERT_TRUE(attn->BackwardWeight({}, &ctx).ok());
  EXPECT_TRUE(ctx.children[0].saved.empty());
  EXPECT_TRUE(ctx.children[1].saved.empty());

  Relu relu(backend());
  LayerContext relu_ctx;
  auto r = relu.Forward(RandomHost({2, 3}, 4), {}, &relu_ctx);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(relu.BackwardInput(*r, {}, &relu_ctx, true).ok());
  EXPECT_TRUE(relu_ctx.saved.empty());
}

v1::ModelSpec ParseSpec(const char* json) {
  v1::ModelSpec spec;
  const absl::Status status = ParseJson(json, &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

// Both copies of `spec`'s layers [begin, end) from the same seed.
void CheckModel(const v1::ModelSpec& spec, int begin, int end,
                const std::vector<Tensor>& inputs, bool need_dx) {
  auto backend = CreateCpuBackend(1);
  auto full = Model::Build(spec, begin, end, backend.get(), 5);
  auto split = Model::Build(spec, begin, end, backend.get(), 5);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(split.ok()) << split.status();
  ExpectSplitMatchesFull(ModelPass(full->get()), ModelPass(split->get()),
                         inputs, need_dx);
}

TEST(SplitBackwardModel, Mlp) {
  const v1::ModelSpec spec = ParseSpec(R"({
    "inputKind": "INPUT_KIND_FLOAT", "inputShape": [1, 4, 4],
    "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
    "layers": [
      {"flatten": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 12}},
      {"relu": {}},
      {"dropout": {"rate": 0.1}},
      {"linear": {"inFeatures": 12, "outFeatures": 8}},
      {"gelu": {}},
      {"layerNorm": {"features": 8}},
      {"linear": {"inFeatures": 8, "outFeatures": 3}}
    ]})");
  const std::vector<Tensor> inputs = {RandomHost({3, 1, 4, 4}, 1),
                                      RandomHost({3, 1, 4, 4}, 2)};
  CheckModel(spec, 0, spec.layers_size(), inputs, /*need_dx=*/false);
  // A middle stage: dx flows on to the previous stage.
  const std::vector<Tensor> hidden = {RandomHost({3, 12}, 3),
                                      RandomHost({3, 12}, 4)};
  CheckModel(spec, 2, 7, hidden, /*need_dx=*/true);
}

TEST(SplitBackwardModel, LanguageModel) {
  const v1::ModelSpec spec = ParseSpec(R"({
    "inputKind": "INPUT_KIND_TOKENS", "inputShape": [6],
    "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
    "layers": [
      {"embedding": {"vocabSize": 11, "dim": 8, "maxSeqLen": 6}},
      {"transformerBlock": {"dim": 8, "heads": 2}},
      {"attention": {"dim": 8, "heads": 2}},
      {"transformerBlock": {"dim": 8, "heads": 2, "mlpDim": 16}},
      {"layerNorm": {"features": 8}},
      {"linear": {"inFeatures": 8, "outFeatures": 11}}
    ]})");
  std::vector<Tensor> ids;
  for (int m = 0; m < kMicroBatches; ++m) {
    Tensor t = Tensor::Host({2, 6});
    for (int64_t i = 0; i < t.numel(); ++i) {
      t.f32()[i] = static_cast<float>((i * 7 + m * 3) % 11);
    }
    ids.push_back(t);
  }
  CheckModel(spec, 0, spec.layers_size(), ids, /*need_dx=*/false);
  const std::vector<Tensor> hidden = {RandomHost({2, 6, 8}, 5),
                                      RandomHost({2, 6, 8}, 6)};
  CheckModel(spec, 1, 4, hidden, /*need_dx=*/true);
}

TEST(SplitBackwardModel, MismatchedContextsAreRejected) {
  const v1::ModelSpec spec = ParseSpec(R"({
    "inputKind": "INPUT_KIND_FLOAT", "inputShape": [4],
    "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
    "layers": [{"linear": {"inFeatures": 4, "outFeatures": 3}}]})");
  auto backend = CreateCpuBackend(1);
  auto model = Model::Build(spec, 0, 1, backend.get(), 5);
  ASSERT_TRUE(model.ok());
  std::vector<LayerContext> none;
  EXPECT_EQ((*model)->BackwardWeight({}, &none).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipetrain
