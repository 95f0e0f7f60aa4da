// init_from names an export file or another job's checkpoint; saved weights
// fit a model only layer for layer.
#include "spec/init_from.h"

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

TEST(ParseInitFrom, FilesAndCheckpoints) {
  absl::StatusOr<InitSource> s = ParseInitFrom("runs/model.safetensors");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kind, InitSource::Kind::kFile);
  EXPECT_EQ(s->path, "runs/model.safetensors");

  s = ParseInitFrom("job:job-7");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kind, InitSource::Kind::kCheckpoint);
  EXPECT_EQ(s->job_id, "job-7");
  EXPECT_EQ(s->version, 0);  // the latest

  s = ParseInitFrom("job:job-7@12");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->job_id, "job-7");
  EXPECT_EQ(s->version, 12);
}

TEST(ParseInitFrom, RefusesMalformedValuesNamingThem) {
  for (const char* bad : {"job:", "job:@3", "job:job-1@", "job:job-1@0",
                          "job:job-1@-2", "job:job-1@x", ""}) {
    const absl::Status s = ParseInitFrom(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(std::string("\"") + bad + "\""));
  }
}

v1::ModelSpec Mlp(int hidden, float dropout) {
  v1::ModelSpec m;
  const absl::Status parsed = ParseJson(
      absl::StrCat(R"({"inputKind": "INPUT_KIND_FLOAT", "inputShape": [8],
        "layers": [{"linear": {"inFeatures": 8, "outFeatures": )",
                   hidden, R"(}}, {"relu": {}},
        {"dropout": {"rate": )",
                   dropout, R"(}}, {"layerNorm": {"features": )", hidden,
                   R"(}}, {"linear": {"inFeatures": )", hidden,
                   R"(, "outFeatures": 3}}]})"),
      &m);
  EXPECT_TRUE(parsed.ok()) << parsed;
  return m;
}

TEST(CheckSameParameters, AllowsSettingsWithoutParameters) {
  v1::ModelSpec other = Mlp(16, 0.5);
  other.mutable_layers(3)->mutable_layer_norm()->set_eps(1e-3);
  other.mutable_layers(0)->set_name("renamed");
  EXPECT_TRUE(CheckSameParameters(Mlp(16, 0.1), other).ok());
}

TEST(CheckSameParameters, NamesTheFirstLayerThatDiffers) {
  absl::Status s = CheckSameParameters(Mlp(16, 0), Mlp(32, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer 0 differs"));

  v1::ModelSpec no_bias = Mlp(16, 0);
  no_bias.mutable_layers(4)->mutable_linear()->set_no_bias(true);
  s = CheckSameParameters(Mlp(16, 0), no_bias);
  EXPECT_THAT(s.message(), HasSubstr("layer 4 differs"));

  v1::ModelSpec relu_for_gelu = Mlp(16, 0);
  relu_for_gelu.mutable_layers(1)->mutable_gelu();
  s = CheckSameParameters(Mlp(16, 0), relu_for_gelu);
  EXPECT_THAT(s.message(), HasSubstr("layer 1 differs"));

  v1::ModelSpec deeper = Mlp(16, 0);
  deeper.add_layers()->mutable_relu();
  s = CheckSameParameters(Mlp(16, 0), deeper);
  EXPECT_THAT(s.message(), HasSubstr("has 6 layers, this job's model 5"));

  v1::ModelSpec wider_input = Mlp(16, 0);
  wider_input.set_input_shape(0, 9);
  s = CheckSameParameters(Mlp(16, 0), wider_input);
  EXPECT_THAT(s.message(), HasSubstr("input [9]"));
}

}  // namespace
}  // namespace pipetrain
