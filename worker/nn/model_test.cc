// Built models: layer ranges are checked, and initialization and outputs
// do not depend on the partition.
#include "worker/nn/model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/layers.h"
#include "worker/nn/optimizer.h"

namespace pipetrain {
namespace {

using test_specs::kLm;
using test_specs::kMlp;
using test_specs::Parse;

// `rows` samples for `spec`'s input: token ids below 11, or uniforms drawn
// from `seed`.
Tensor SampleInput(const v1::ModelSpec& spec, int64_t rows, uint64_t seed) {
  Shape in = {rows};
  for (int64_t d : spec.input_shape()) in.push_back(d);
  Tensor x = Tensor::Host(in);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.f32()[i] = spec.input_kind() == v1::INPUT_KIND_TOKENS
                     ? static_cast<float>(i % 11)
                     : math::UniformAt(seed, i);
  }
  return x;
}

TEST(Model, BadLayerRangesAreRejected) {
  auto backend = CreateCpuBackend(1);
  const v1::ModelSpec spec = Parse(kMlp);
  for (auto [b, e] : {std::pair{0, 9}, {3, 3}, {-1, 2}, {5, 4}}) {
    auto model = Model::Build(spec, b, e, backend.get(), 1);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument)
        << b << ", " << e;
  }
}

// The same seed gives the same weights for layer i whether it is built as
// part of the whole model or of any stage, and stages compose to the whole.
TEST(Model, InitializationAndOutputsDoNotDependOnThePartition) {
  auto backend = CreateCpuBackend(1);
  for (const char* json : {kMlp, kLm}) {
    const v1::ModelSpec spec = Parse(json);
    const int n = spec.layers_size();
    auto whole = Model::Build(spec, 0, n, backend.get(), 1234);
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto whole_params = (*whole)->ParamsToHost();
    ASSERT_TRUE(whole_params.ok());

    std::vector<std::unique_ptr<Model>> stages;
    std::vector<Tensor> stage_params;
    for (auto [b, e] : {std::pair{0, 2}, {2, 3}, {3, n}}) {
      auto stage = Model::Build(spec, b, e, backend.get(), 1234);
      ASSERT_TRUE(stage.ok()) << stage.status();
      auto p = (*stage)->ParamsToHost();
      ASSERT_TRUE(p.ok());
      stage_params.insert(stage_params.end(), p->begin(), p->end());
      stages.push_back(std::move(*stage));
    }
    ASSERT_EQ(stage_params.size(), whole_params->size());
    for (size_t i = 0; i < stage_params.size(); ++i) {
      EXPECT_EQ(stage_params[i].ToVector(), (*whole_params)[i].ToVector())
          << (*whole)->params()[i]->name;
    }

    // A different seed gives different weights.
    auto other = Model::Build(spec, 0, n, backend.get(), 99);
    ASSERT_TRUE(other.ok());
    EXPECT_NE((*other)->ParamsToHost()->at(0).ToVector(),
              (*whole_params)[0].ToVector());

    // Running the stages one after another equals running the whole model.
    const Tensor x = SampleInput(spec, 2, 5);
    ForwardOptions options;
    options.dropout_seed = 77;
    auto y_whole = (*whole)->Forward(x, options, nullptr);
    ASSERT_TRUE(y_whole.ok()) << y_whole.status();
    Tensor h = x;
    for (auto& stage : stages) {
      auto next = stage->Forward(h, options, nullptr);
      ASSERT_TRUE(next.ok()) << next.status();
      h = *next;
    }
    EXPECT_EQ(h.ToVector(), y_whole->ToVector());
  }
}

// The checksum follows the values: equal weights, equal checksums; one
// changed element, or two swapped, change it.
TEST(Model, ParamsChecksumFollowsTheValues) {
  auto backend = CreateCpuBackend(1);
  const v1::ModelSpec spec = Parse(kMlp);
  const int n = spec.layers_size();
  auto a = Model::Build(spec, 0, n, backend.get(), 7);
  auto b = Model::Build(spec, 0, n, backend.get(), 7);
  ASSERT_TRUE(a.ok() && b.ok());
  auto sum = [&](Model* m) {
    auto c = ParamsChecksum(backend.get(), m->params());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.value_or(0);
  };
  const uint64_t original = sum(a->get());
  EXPECT_EQ(sum(b->get()), original);
  float* w = (*b)->params()[0]->value.f32();
  w[3] = std::nextafter(w[3], 1.0f);
  const uint64_t nudged = sum(b->get());
  EXPECT_NE(nudged, original);
  w[3] = std::nextafter(w[3], -1.0f);
  EXPECT_EQ(sum(b->get()), original);
  std::swap(w[0], w[1]);
  EXPECT_NE(sum(b->get()), original);
}

// With ReuseWeights the layers multiply by packed copies of their weights;
// the copies follow every write of the weights (an optimizer step, a load)
// and give what the plain products give, within float rounding. Each write
// moves the outputs by far more than that tolerance, so a stale copy fails.
TEST(Model, ReusedWeightsFollowEveryWriteOfTheWeights) {
  auto backend = CreateCpuBackend(1);
  for (const char* json : {kMlp, kLm}) {
    const v1::ModelSpec spec = Parse(json);
    const int n = spec.layers_size();
    auto reused = Model::Build(spec, 0, n, backend.get(), 5);
    auto plain = Model::Build(spec, 0, n, backend.get(), 5);
    ASSERT_TRUE(reused.ok() && plain.ok());
    (*reused)->ReuseWeights(true);
    const Tensor x = SampleInput(spec, 3, 9);
    ForwardOptions options;
    options.dropout_seed = 3;
    // Forward and backward on both; returns the reused model's output.
    auto run_both = [&](const char* when) -> std::vector<float> {
      std::vector<float> outputs[2];
      std::vector<float> dxs[2];
      Model* models[2] = {reused->get(), plain->get()};
      for (int i = 0; i < 2; ++i) {
        ZeroGrads(models[i]->params());
        std::vector<LayerContext> contexts;
        auto y = models[i]->Forward(x, options, &contexts);
        EXPECT_TRUE(y.ok()) << y.status();
        if (!y.ok()) return {};
        Tensor dy = Tensor::Host(y->shape());
        for (int64_t j = 0; j < dy.numel(); ++j) {
          dy.f32()[j] = math::UniformAt(11, j);
        }
        // The token model's first layer has no input gradient.
        const bool need_dx = spec.input_kind() != v1::INPUT_KIND_TOKENS;
        auto dx = models[i]->Backward(dy, options, &contexts, need_dx);
        EXPECT_TRUE(dx.ok()) << dx.status();
        outputs[i] = y->ToVector();
        if (need_dx) dxs[i] = dx->ToVector();
      }
      EXPECT_EQ(outputs[0].size(), outputs[1].size());
      for (size_t j = 0; j < outputs[0].size(); ++j) {
        EXPECT_NEAR(outputs[0][j], outputs[1][j],
                    1e-4 * std::max(1.0f, std::fabs(outputs[1][j])))
            << when << " y " << j;
      }
      for (size_t j = 0; j < dxs[0].size(); ++j) {
        EXPECT_NEAR(dxs[0][j], dxs[1][j],
                    1e-4 * std::max(1.0f, std::fabs(dxs[1][j])))
            << when << " dx " << j;
      }
      const auto& pr = (*reused)->params();
      const auto& pp = (*plain)->params();
      for (size_t p = 0; p < pr.size(); ++p) {
        const std::vector<float> gr = pr[p]->grad.ToVector();
        const std::vector<float> gp = pp[p]->grad.ToVector();
        for (size_t j = 0; j < gr.size(); ++j) {
          EXPECT_NEAR(gr[j], gp[j], 1e-4 * std::max(1.0f, std::fabs(gp[j])))
              << when << " " << pr[p]->name;
        }
      }
      return outputs[0];
    };
    auto moved = [](const std::vector<float>& a, const std::vector<float>& b) {
      double most = 0;
      for (size_t j = 0; j < a.size() && j < b.size(); ++j) {
        most = std::max(most, std::fabs(double(a[j]) - b[j]));
      }
      return most;
    };
    const std::vector<float> first = run_both("initial");

    v1::OptimizerSpec opt_spec;
    opt_spec.mutable_sgd()->set_lr(0.5f);
    auto opt_reused = Optimizer::Create(opt_spec, backend.get());
    auto opt_plain = Optimizer::Create(opt_spec, backend.get());
    ASSERT_TRUE(opt_reused.ok() && opt_plain.ok());
    ASSERT_TRUE((*opt_reused)->Step((*reused)->params()).ok());
    ASSERT_TRUE((*opt_plain)->Step((*plain)->params()).ok());
    const std::vector<float> stepped = run_both("after a step");
    EXPECT_GT(moved(first, stepped), 1e-2);

    auto other = Model::Build(spec, 0, n, backend.get(), 6);
    ASSERT_TRUE(other.ok());
    auto weights = (*other)->ParamsToHost();
    ASSERT_TRUE(weights.ok());
    ASSERT_TRUE((*reused)->LoadParams(*weights).ok());
    ASSERT_TRUE((*plain)->LoadParams(*weights).ok());
    const std::vector<float> loaded = run_both("after a load");
    EXPECT_GT(moved(stepped, loaded), 1e-2);
  }
}

// One SGD step (lr 0.5) of `params` from gradients set to a fixed pattern.
void StepWithFixedGradients(Backend* backend,
                            const std::vector<Param*>& params) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.5f);
  auto opt = Optimizer::Create(spec, backend);
  ASSERT_TRUE(opt.ok());
  for (Param* p : params) {
    for (int64_t j = 0; j < p->grad.numel(); ++j) {
      p->grad.f32()[j] = math::UniformAt(7, j);
    }
    p->grad_fresh = false;
  }
  ASSERT_TRUE((*opt)->Step(params).ok());
}

// PrepareWeights lays the updated weights out when called, not at the next
// pass: a pass after it multiplies by the weights as they were then. (The
// test writes the weights behind the model's back, without the version
// bump every real writer makes, to see which copy the pass used.)
TEST(Model, PreparedWeightsAreTheWeightsAtPreparation) {
  auto backend = CreateCpuBackend(1);
  const v1::ModelSpec spec = Parse(kMlp);
  const int n = spec.layers_size();
  auto reused = Model::Build(spec, 0, n, backend.get(), 5);
  auto plain = Model::Build(spec, 0, n, backend.get(), 5);
  ASSERT_TRUE(reused.ok() && plain.ok());
  (*reused)->ReuseWeights(true);
  const Tensor x = SampleInput(spec, 4, 9);
  ForwardOptions options;
  auto forward = [&](Model* model) {
    std::vector<LayerContext> contexts;
    auto y = model->Forward(x, options, &contexts);
    EXPECT_TRUE(y.ok()) << y.status();
    return y.ok() ? y->ToVector() : std::vector<float>();
  };
  forward(reused->get());  // packs W at first use

  for (Model* model : {reused->get(), plain->get()}) {
    StepWithFixedGradients(backend.get(), model->params());
  }
  ASSERT_TRUE((*reused)->PrepareWeights().ok());
  for (Param* p : (*reused)->params()) {
    if (p->name.find("weight") == std::string::npos) continue;
    for (int64_t j = 0; j < p->value.numel(); ++j) p->value.f32()[j] = NAN;
  }
  const std::vector<float> want = forward(plain->get());
  const std::vector<float> got = forward(reused->get());
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_NEAR(got[j], want[j], 1e-4 * std::max(1.0f, std::fabs(want[j])))
        << j;
  }
}

// PrepareWeights(kForward) remakes the forward copy only: after an update
// and a forward-only preparation, the weights are overwritten behind the
// layer's back (no version bump); the forward still multiplies by the
// updated weights, while dx, whose W^T copy was left stale, lays W^T out
// from what the weights hold now (NaN). kAll remakes both.
TEST(Model, PreparingTheForwardCopiesLeavesTheTransposedOnesStale) {
  auto backend = CreateCpuBackend(1);
  for (const PackedCopies copies :
       {PackedCopies::kForward, PackedCopies::kAll}) {
    auto reused = Linear::Create(backend.get(), 64, 48, true, 3);
    auto plain = Linear::Create(backend.get(), 64, 48, true, 3);
    ASSERT_TRUE(reused.ok() && plain.ok());
    (*reused)->ReuseWeights(true);
    Tensor x = Tensor::Host({4, 64});
    Tensor dy = Tensor::Host({4, 48});
    for (int64_t j = 0; j < x.numel(); ++j) x.f32()[j] = math::UniformAt(1, j);
    for (int64_t j = 0; j < dy.numel(); ++j)
      dy.f32()[j] = math::UniformAt(2, j);
    const ForwardOptions options;
    LayerContext ctx;
    // Both copies made at first use.
    ASSERT_TRUE((*reused)->Forward(x, options, &ctx).ok());
    ASSERT_TRUE((*reused)->Backward(dy, options, &ctx, true).ok());

    for (Linear* layer : {reused->get(), plain->get()}) {
      StepWithFixedGradients(backend.get(), layer->params());
    }
    ASSERT_TRUE((*reused)->PrepareWeights(copies).ok());
    Param* w = (*reused)->params()[0];
    for (int64_t j = 0; j < w->value.numel(); ++j) w->value.f32()[j] = NAN;

    LayerContext want_ctx, got_ctx;
    auto want_y = (*plain)->Forward(x, options, &want_ctx);
    auto got_y = (*reused)->Forward(x, options, &got_ctx);
    ASSERT_TRUE(want_y.ok() && got_y.ok());
    const std::vector<float> want = want_y->ToVector();
    const std::vector<float> got = got_y->ToVector();
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_NEAR(got[j], want[j], 1e-4 * std::max(1.0f, std::fabs(want[j])));
    }
    auto want_dx = (*plain)->Backward(dy, options, &want_ctx, true);
    auto got_dx = (*reused)->Backward(dy, options, &got_ctx, true);
    ASSERT_TRUE(want_dx.ok() && got_dx.ok());
    const std::vector<float> dx = got_dx->ToVector();
    const std::vector<float> want_grad = want_dx->ToVector();
    if (copies == PackedCopies::kForward) {
      EXPECT_TRUE(std::isnan(dx[0])) << "W^T was remade";
    } else {
      for (size_t j = 0; j < dx.size(); ++j) {
        EXPECT_NEAR(dx[j], want_grad[j],
                    1e-4 * std::max(1.0f, std::fabs(want_grad[j])));
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain
