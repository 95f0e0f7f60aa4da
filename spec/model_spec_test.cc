// Model specs: JSON parsing, the per-layer shapes, and validation errors
// that name the layer and field.
#include "spec/model_spec.h"

#include <string>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"

namespace pipetrain {
namespace {

using test_specs::kLm;
using test_specs::kMlp;
using test_specs::Parse;

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

}  // namespace
}  // namespace pipetrain
