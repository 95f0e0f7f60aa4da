// Training state in the checkpoint naming and layout: exported and
// imported into fresh models and optimizers, training goes on exactly as if
// it had never stopped, under any partition of the layers; malformed state
// is refused with the tensor's name and changes nothing.
#include "worker/nn/model_state.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/loss.h"

namespace pipetrain {
namespace {

using test_specs::kLm;
using test_specs::kMlp;
using test_specs::Parse;
using ::testing::HasSubstr;

v1::OptimizerSpec Sgd() {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.1f);
  spec.mutable_sgd()->set_momentum(0.9f);
  spec.mutable_sgd()->set_weight_decay(0.01f);
  return spec;
}

v1::OptimizerSpec Adam() {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.01f);
  spec.mutable_adamw()->set_weight_decay(0.1f);
  return spec;
}

// One stage of a cut model: its layers and its own optimizer.
struct Stage {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
};

class ModelStateTest : public ::testing::Test {
 protected:
  // The model cut before each layer index in `cuts`.
  std::vector<Stage> Build(const v1::ModelSpec& spec, std::vector<int> cuts,
                           uint64_t seed, const v1::OptimizerSpec& opt) {
    std::vector<Stage> out;
    cuts.insert(cuts.begin(), 0);
    cuts.push_back(spec.layers_size());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      Stage stage;
      auto model =
          Model::Build(spec, cuts[i], cuts[i + 1], backend_.get(), seed);
      EXPECT_TRUE(model.ok()) << model.status();
      auto optimizer = Optimizer::Create(opt, backend_.get());
      EXPECT_TRUE(optimizer.ok()) << optimizer.status();
      if (!model.ok() || !optimizer.ok()) return {};
      stage.model = std::move(*model);
      stage.optimizer = std::move(*optimizer);
      out.push_back(std::move(stage));
    }
    return out;
  }

  // One training step of the stages in sequence on a batch drawn from
  // `step`: forward through every stage, loss, backward through every
  // stage, then each stage's optimizer.
  void TrainStep(const v1::ModelSpec& spec, std::vector<Stage>& stages,
                 int step) {
    const bool tokens = spec.input_kind() == v1::INPUT_KIND_TOKENS;
    Shape in = {3};
    for (int64_t d : spec.input_shape()) in.push_back(d);
    Tensor x = Tensor::Host(in);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float u = math::UniformAt(100 + step, static_cast<uint64_t>(i));
      x.f32()[i] = tokens ? static_cast<float>(static_cast<int>(u * 11)) : u;
    }
    ForwardOptions options;
    options.dropout_seed = 7 + step;
    std::vector<std::vector<LayerContext>> contexts(stages.size());
    Tensor h = x;
    for (size_t s = 0; s < stages.size(); ++s) {
      auto y = stages[s].model->Forward(h, options, &contexts[s]);
      ASSERT_TRUE(y.ok()) << y.status();
      h = *y;
    }
    const int classes = tokens ? 11 : 3;
    Shape label_shape(h.shape().begin(), h.shape().end() - 1);
    Tensor labels = Tensor::Host(label_shape);
    for (int64_t i = 0; i < labels.numel(); ++i) {
      labels.f32()[i] = static_cast<float>((i * 7 + step) % classes);
    }
    SoftmaxCrossEntropyLoss loss(backend_.get());
    LayerContext loss_ctx;
    ASSERT_TRUE(loss.Forward(h, labels, &loss_ctx).ok());
    auto g =
        loss.Backward(1.0f / static_cast<float>(labels.numel()), &loss_ctx);
    ASSERT_TRUE(g.ok()) << g.status();
    Tensor dy = *g;
    for (size_t s = stages.size(); s-- > 0;) {
      auto dx = stages[s].model->Backward(dy, options, &contexts[s], s > 0);
      ASSERT_TRUE(dx.ok()) << dx.status();
      dy = *dx;
    }
    for (Stage& stage : stages) {
      ASSERT_TRUE(stage.optimizer->Step(stage.model->params()).ok());
    }
  }

  // The stages' state merged (each stage's tensors under their names).
  TrainingState Export(const std::vector<Stage>& stages) {
    TrainingState out;
    for (const Stage& stage : stages) {
      auto state = ExportTrainingState({stage.model.get()}, *stage.optimizer,
                                       backend_.get());
      EXPECT_TRUE(state.ok()) << state.status();
      if (!state.ok()) continue;
      out.tensors.merge(state->tensors);
      out.optimizer_steps = state->optimizer_steps;
    }
    return out;
  }

  void Import(const TrainingState& state, std::vector<Stage>& stages) {
    for (Stage& stage : stages) {
      const absl::Status status = ImportTrainingState(
          state, {stage.model.get()}, stage.optimizer.get(), backend_.get());
      ASSERT_TRUE(status.ok()) << status;
    }
  }

  // Bitwise equal tensors under equal names.
  static void ExpectSameState(const TrainingState& got,
                              const TrainingState& want) {
    EXPECT_EQ(got.optimizer_steps, want.optimizer_steps);
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (const auto& [name, tensor] : want.tensors) {
      auto it = got.tensors.find(name);
      ASSERT_NE(it, got.tensors.end()) << name;
      EXPECT_EQ(it->second.shape(), tensor.shape()) << name;
      EXPECT_EQ(it->second.ToVector(), tensor.ToVector()) << name;
    }
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
};

// Export after two steps, import into a differently seeded model and a
// fresh optimizer, take a third step on both: identical (bitwise) weights
// and optimizer state. Under any cut of the layers as well.
TEST_F(ModelStateTest, TrainingGoesOnIdenticallyUnderAnyPartition) {
  struct Case {
    const char* json;
    std::vector<std::vector<int>> cuts;
  };
  for (const Case& c :
       {Case{kMlp, {{}, {3}, {1, 5}}}, Case{kLm, {{}, {1}, {2, 3}}}}) {
    const v1::ModelSpec spec = Parse(c.json);
    for (const v1::OptimizerSpec& opt : {Sgd(), Adam()}) {
      SCOPED_TRACE(spec.name() + " " + opt.ShortDebugString());
      std::vector<Stage> whole = Build(spec, {}, 11, opt);
      TrainStep(spec, whole, 0);
      TrainStep(spec, whole, 1);
      const TrainingState saved = Export(whole);
      EXPECT_EQ(saved.optimizer_steps, 2);
      TrainStep(spec, whole, 2);
      const TrainingState want = Export(whole);
      for (const std::vector<int>& cuts : c.cuts) {
        SCOPED_TRACE(::testing::PrintToString(cuts));
        std::vector<Stage> resumed = Build(spec, cuts, 99, opt);
        Import(saved, resumed);
        ExpectSameState(Export(resumed), saved);
        TrainStep(spec, resumed, 2);
        ExpectSameState(Export(resumed), want);
      }
    }
  }
}

// Names by global layer index with stable child names; a linear weight is
// [out, in] in the checkpoint, the transpose of the layer's [in, out].
TEST_F(ModelStateTest, NamesAndLayoutFollowTheCheckpointConvention) {
  const v1::ModelSpec spec = Parse(kLm);
  std::vector<Stage> stages = Build(spec, {1}, 5, Adam());
  TrainStep(spec, stages, 0);
  auto state = ExportTrainingState({stages[1].model.get()},
                                   *stages[1].optimizer, backend_.get());
  ASSERT_TRUE(state.ok()) << state.status();
  for (const char* name :
       {"layers.1.ln1.gamma", "layers.1.ln1.beta", "layers.1.attn.qkv.weight",
        "layers.1.attn.qkv.bias", "layers.1.attn.out.weight",
        "layers.1.ln2.beta", "layers.1.fc1.weight", "layers.1.fc2.bias",
        "layers.2.fc1.weight", "layers.3.gamma", "layers.4.weight",
        "layers.4.bias", "optimizer.layers.1.attn.qkv.weight.m",
        "optimizer.layers.4.weight.v"}) {
    EXPECT_EQ(state->tensors.count(name), 1u) << name;
  }
  EXPECT_EQ(state->tensors.count("layers.0.tokens"), 0u);
  // 4 layers of the stage's 13 parameters, and m and v for each.
  EXPECT_EQ(state->tensors.size(), 3u * stages[1].model->params().size());

  // layers.2.fc1: 8 -> 16 (mlpDim) stored [8, 16], exported [16, 8].
  const Param* fc1 = nullptr;
  for (const Param* p : stages[1].model->params()) {
    if (p->name == "layers.2.fc1.weight") fc1 = p;
  }
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->value.shape(), (Shape{8, 16}));
  const Tensor& exported = state->tensors.at("layers.2.fc1.weight");
  ASSERT_EQ(exported.shape(), (Shape{16, 8}));
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t o = 0; o < 16; ++o) {
      EXPECT_EQ(exported.f32()[o * 8 + i], fc1->value.f32()[i * 16 + o]);
    }
  }
  // The layout lists the same tensors with the same shapes.
  const StateLayout layout =
      StateLayout::Of({stages[1].model.get()}, *stages[1].optimizer);
  ASSERT_EQ(layout.tensors().size(), state->tensors.size());
  for (const auto& [name, shape] : layout.tensors()) {
    EXPECT_EQ(state->tensors.at(name).shape(), shape) << name;
  }
  EXPECT_TRUE(layout.OwnsLayer(1) && layout.OwnsLayer(4));
  EXPECT_FALSE(layout.OwnsLayer(0) || layout.OwnsLayer(5));
}

// Each malformed state fails with InvalidArgument naming the tensor and
// leaves the weights and optimizer as they were.
TEST_F(ModelStateTest, MalformedStateIsRefusedAndChangesNothing) {
  const v1::ModelSpec spec = Parse(kMlp);
  std::vector<Stage> source = Build(spec, {}, 3, Adam());
  TrainStep(spec, source, 0);
  const TrainingState good = Export(source);
  std::vector<Stage> target = Build(spec, {}, 8, Adam());
  TrainStep(spec, target, 5);
  const TrainingState before = Export(target);

  struct Case {
    std::string what;
    std::string name;  // the tensor the message must name
    std::function<void(TrainingState*)> edit;
  };
  const std::vector<Case> cases = {
      {"wrong shape", "layers.4.weight",
       [](TrainingState* s) {
         s->tensors["layers.4.weight"] = Tensor::Host({12, 8});
       }},
      {"missing parameter", "layers.7.bias",
       [](TrainingState* s) { s->tensors.erase("layers.7.bias"); }},
      {"unknown parameter", "layers.4.gamma",
       [](TrainingState* s) {
         s->tensors["layers.4.gamma"] = Tensor::Host({8});
       }},
      {"parameter of a layer without any", "layers.5.weight",
       [](TrainingState* s) {
         s->tensors["layers.5.weight"] = Tensor::Host({8});
       }},
      {"malformed index", "layers.x.weight",
       [](TrainingState* s) {
         s->tensors["layers.x.weight"] = Tensor::Host({1});
       }},
      {"malformed name", "layers.4..weight",
       [](TrainingState* s) {
         s->tensors["layers.4..weight"] = Tensor::Host({1});
       }},
      {"unknown name", "model.weight",
       [](TrainingState* s) {
         s->tensors["model.weight"] = Tensor::Host({1});
       }},
      {"unknown slot", "optimizer.layers.4.weight.momentum",
       [](TrainingState* s) {
         s->tensors["optimizer.layers.4.weight.momentum"] =
             Tensor::Host({8, 12});
       }},
      {"half the slots", "optimizer.layers.6.beta.v",
       [](TrainingState* s) { s->tensors.erase("optimizer.layers.6.beta.v"); }},
      {"one parameter without its slots", "optimizer.layers.1.bias.m",
       [](TrainingState* s) {
         s->tensors.erase("optimizer.layers.1.bias.m");
         s->tensors.erase("optimizer.layers.1.bias.v");
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TrainingState bad = good;
    c.edit(&bad);
    const absl::Status status =
        ImportTrainingState(bad, {target[0].model.get()},
                            target[0].optimizer.get(), backend_.get());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.name));
    ExpectSameState(Export(target), before);
  }
}

// A stage ignores whatever the state holds for layers it does not have,
// well-formed or not.
TEST_F(ModelStateTest, OtherLayersTensorsAreIgnored) {
  const v1::ModelSpec spec = Parse(kMlp);
  std::vector<Stage> source = Build(spec, {}, 3, Sgd());
  TrainStep(spec, source, 0);
  TrainingState state = Export(source);
  state.tensors["layers.1.weight"] = Tensor::Host({1, 2, 3});
  state.tensors["layers.100.anything"] = Tensor::Host({1});
  std::vector<Stage> tail = Build(spec, {4}, 8, Sgd());
  const absl::Status status = ImportTrainingState(
      state, {tail[1].model.get()}, tail[1].optimizer.get(), backend_.get());
  ASSERT_TRUE(status.ok()) << status;
  auto got = tail[1].model->ParamsToHost();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->back().ToVector(),
            state.tensors.at("layers.7.bias").ToVector());
}

// Parameters without optimizer state (initializing from exported weights)
// start a fresh optimizer: Adam's step count restarts at 0. With the state,
// the count comes from it.
TEST_F(ModelStateTest, FreshOptimizerStateRestartsTheStepCount) {
  const v1::ModelSpec spec = Parse(kMlp);
  std::vector<Stage> source = Build(spec, {}, 3, Adam());
  for (int step = 0; step < 3; ++step) TrainStep(spec, source, step);
  TrainingState state = Export(source);
  ASSERT_EQ(state.optimizer_steps, 3);
  std::vector<Stage> target = Build(spec, {}, 8, Adam());
  Import(state, target);
  EXPECT_EQ(target[0].optimizer->steps(), 3);
  for (auto it = state.tensors.begin(); it != state.tensors.end();) {
    it = it->first.rfind("optimizer.", 0) == 0 ? state.tensors.erase(it)
                                               : std::next(it);
  }
  Import(state, target);
  EXPECT_EQ(target[0].optimizer->steps(), 0);
  auto exported = ExportTrainingState({target[0].model.get()},
                                      *target[0].optimizer, backend_.get());
  ASSERT_TRUE(exported.ok());
  // The weights as given; the optimizer's state as it starts: zeros.
  for (const auto& [name, tensor] : exported->tensors) {
    if (name.rfind("optimizer.", 0) == 0) {
      EXPECT_EQ(tensor.ToVector(), std::vector<float>(tensor.numel(), 0.0f))
          << name;
    } else {
      EXPECT_EQ(tensor.ToVector(), state.tensors.at(name).ToVector()) << name;
    }
  }
  EXPECT_EQ(exported->tensors.size(), 3 * state.tensors.size());
}

}  // namespace
}  // namespace pipetrain
