// Model specs: JSON parsing, validation errors that name the layer and
// field, and initialization that does not depend on the partition.
#include "worker/nn/model.h"

#include <cmath>
#include <utility>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace {

constexpr char kMlp[] = R"({
  "name": "mlp",
  "inputKind": "INPUT_KIND_FLOAT",
  "inputShape": [1, 4, 4],
  "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
  "layers": [
    {"flatten": {}},
    {"linear": {"inFeatures": 16, "outFeatures": 12}},
    {"relu": {}},
    {"dropout": {"rate": 0.1}},
    {"linear": {"in_features": 12, "out_features": 8}},
    {"gelu": {}},
    {"layer_norm": {"features": 8}},
    {"linear": {"in_features": 8, "out_features": 3}}
  ]
})";

constexpr char kLm[] = R"({
  "inputKind": "INPUT_KIND_TOKENS",
  "inputShape": [6],
  "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
  "layers": [
    {"embedding": {"vocabSize": 11, "dim": 8, "maxSeqLen": 6}},
    {"transformerBlock": {"dim": 8, "heads": 2}},
    {"transformerBlock": {"dim": 8, "heads": 2, "mlpDim": 16}},
    {"layerNorm": {"features": 8}},
    {"linear": {"inFeatures": 8, "outFeatures": 11}}
  ]
})";

v1::ModelSpec Parse(const char* json) {
  v1::ModelSpec spec;
  const absl::Status status = ParseJson(json, &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

// Expects validation to fail with InvalidArgument mentioning `needle`.
void ExpectInvalid(const v1::ModelSpec& spec, const std::string& needle) {
  auto shapes = ValidateModelSpec(spec);
  ASSERT_FALSE(shapes.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shapes.status().message().find(needle), std::string::npos)
      << shapes.status();
}

TEST(ModelSpec, ValidSpecsGiveLayerShapes) {
  auto shapes = ValidateModelSpec(Parse(kMlp));
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(shapes->size(), 9u);
  EXPECT_EQ((*shapes)[1], (Shape{16}));
  EXPECT_EQ(shapes->back(), (Shape{3}));
  auto lm = ValidateModelSpec(Parse(kLm));
  ASSERT_TRUE(lm.ok()) << lm.status();
  EXPECT_EQ(lm->back(), (Shape{6, 11}));
}

TEST(ModelSpec, JsonRoundTrips) {
  const v1::ModelSpec spec = Parse(kLm);
  v1::ModelSpec again;
  ASSERT_TRUE(ParseJson(ToJson(spec), &again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
}

TEST(ModelSpec, MalformedJsonAndUnknownFieldsAreRejected) {
  v1::ModelSpec spec;
  EXPECT_EQ(ParseJson("{\"layers\": [", &spec).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status unknown =
      ParseJson(R"({"layers": [{"convolution": {}}]})", &spec);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("convolution"), std::string::npos)
      << unknown;
  EXPECT_EQ(ReadJsonFile("/nonexistent/spec.json", &spec).code(),
            absl::StatusCode::kNotFound);
}

TEST(ModelSpec, ErrorsNameTheLayerAndField) {
  v1::ModelSpec spec = Parse(kMlp);
  spec.mutable_layers(4)->mutable_linear()->set_in_features(13);
  ExpectInvalid(spec, "layers[4].linear.in_features");

  spec = Parse(kMlp);
  spec.mutable_layers(1)->mutable_linear()->set_out_features(0);
  ExpectInvalid(spec, "layers[1].linear.out_features");

  spec = Parse(kMlp);
  spec.mutable_layers(7)->mutable_linear()->set_out_features(-3);
  ExpectInvalid(spec, "layers[7].linear.out_features");

  spec = Parse(kMlp);
  spec.mutable_layers(3)->mutable_dropout()->set_rate(1.5f);
  ExpectInvalid(spec, "layers[3].dropout.rate");

  spec = Parse(kMlp);
  spec.mutable_layers(2)->Clear();  // no kind set
  ExpectInvalid(spec, "layers[2].kind");

  spec = Parse(kMlp);
  spec.mutable_layers(6)->mutable_layer_norm()->set_features(9);
  ExpectInvalid(spec, "layers[6].layer_norm.features");

  spec = Parse(kMlp);
  spec.clear_input_shape();
  ExpectInvalid(spec, "model.input_shape");

  spec = Parse(kLm);
  spec.mutable_layers(1)->mutable_transformer_block()->set_heads(3);
  ExpectInvalid(spec, "layers[1].transformer_block.heads");

  spec = Parse(kLm);
  spec.mutable_layers(0)->mutable_embedding()->set_max_seq_len(4);
  ExpectInvalid(spec, "layers[0].embedding.max_seq_len");

  spec = Parse(kLm);
  spec.clear_loss();
  ExpectInvalid(spec, "model.loss");
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
    Shape in = {2};
    for (int64_t d : spec.input_shape()) in.push_back(d);
    Tensor x = Tensor::Host(in);
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.f32()[i] = spec.input_kind() == v1::INPUT_KIND_TOKENS
                       ? static_cast<float>(i % 11)
                       : math::UniformAt(5, i);
    }
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

}  // namespace
}  // namespace pipetrain
