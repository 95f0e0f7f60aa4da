// Small model specs in JSON that the spec and layer tests share: an MLP
// over 4x4 inputs and a two-block character Transformer. Test-only.
#ifndef PIPETRAIN_SPEC_TEST_MODEL_SPECS_H_
#define PIPETRAIN_SPEC_TEST_MODEL_SPECS_H_

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain {
namespace test_specs {

inline constexpr char kMlp[] = R"({
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

// A whole TrainingSpec: a 7-layer MLP on synthetic data, 6 steps of 32
// samples (the pipeline and checkpoint tests; they set micro-batches).
inline constexpr char kSmallMlpTraining[] = R"({
  "model": {
    "inputKind": "INPUT_KIND_FLOAT", "inputShape": [12],
    "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
    "layers": [
      {"linear": {"inFeatures": 12, "outFeatures": 32}},
      {"gelu": {}},
      {"dropout": {"rate": 0.1}},
      {"layerNorm": {"features": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 4}}
    ]},
  "data": {"synthetic": {"features": 12, "classes": 4,
                         "trainSamples": 1024, "evalSamples": 64}},
  "optimizer": {"sgd": {"lr": 0.1, "momentum": 0.9}, "clipGradNorm": 0.5},
  "batchSize": 32, "steps": 6, "seed": 11})";

inline constexpr char kLm[] = R"({
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

inline v1::ModelSpec Parse(const char* json) {
  v1::ModelSpec spec;
  const absl::Status status = ParseJson(json, &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

}  // namespace test_specs
}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_TEST_MODEL_SPECS_H_
