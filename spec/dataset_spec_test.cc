// The data.numpy and data.token_shards fields are checked at submit, through
// ValidateTrainingSpec, with errors naming the field.
#include "spec/dataset_spec.h"

#include <string>

#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"
#include "spec/training_spec.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

v1::TrainingSpec NumpyJob() {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(R"({
    "model": {
      "inputKind": "INPUT_KIND_FLOAT", "inputShape": [6],
      "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
      "layers": [{"linear": {"inFeatures": 6, "outFeatures": 3}}]},
    "data": {"numpy": {"trainFeatures": "x.npy", "trainLabels": "y.npy",
                       "evalFeatures": "xe.npy", "evalLabels": "ye.npy",
                       "classes": 3, "scale": 0.00392156862, "mean": -0.5,
                       "std": 0.25}},
    "optimizer": {"sgd": {"lr": 0.1}}, "batchSize": 16, "steps": 3})",
                                        &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

v1::TrainingSpec TokenJob() {
  v1::TrainingSpec spec;
  EXPECT_TRUE(ParseJson(test_specs::kLm, spec.mutable_model()).ok());
  EXPECT_TRUE(ParseJson(R"({"trainFile": "train.bin", "evalFile": "val.npy",
                            "seqLen": 6, "vocabSize": 11})",
                        spec.mutable_data()->mutable_token_shards())
                  .ok());
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.set_batch_size(4);
  spec.set_steps(1);
  return spec;
}

void ExpectInvalid(const v1::TrainingSpec& spec, const std::string& text) {
  const absl::Status status = ValidateTrainingSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST(DatasetSpecTest, ValidSourcesPass) {
  EXPECT_TRUE(ValidateTrainingSpec(NumpyJob()).ok())
      << ValidateTrainingSpec(NumpyJob());
  EXPECT_TRUE(ValidateTrainingSpec(TokenJob()).ok())
      << ValidateTrainingSpec(TokenJob());
}

TEST(DatasetSpecTest, NumpyFieldsAreChecked) {
  v1::TrainingSpec spec = NumpyJob();
  spec.mutable_data()->mutable_numpy()->clear_eval_labels();
  ExpectInvalid(spec, "data.numpy.eval_labels: missing");

  spec = NumpyJob();
  spec.mutable_data()->mutable_numpy()->set_classes(1);
  ExpectInvalid(spec, "data.numpy.classes: 1 must lie in 2..");

  spec = NumpyJob();
  spec.mutable_data()->mutable_numpy()->set_classes(4);
  ExpectInvalid(spec,
                "data.numpy.classes: 4 does not match the model's output "
                "width 3");

  spec = NumpyJob();
  spec.mutable_data()->mutable_numpy()->set_scale(-1.0f);
  ExpectInvalid(spec, "data.numpy.scale: -1 must be finite and >= 0");

  spec = NumpyJob();
  spec.mutable_data()->mutable_numpy()->set_std(
      std::numeric_limits<float>::infinity());
  ExpectInvalid(spec, "data.numpy.std: inf must be finite");
}

TEST(DatasetSpecTest, TokenShardFieldsAreChecked) {
  v1::TrainingSpec spec = TokenJob();
  spec.mutable_data()->mutable_token_shards()->set_train_file("train.txt");
  ExpectInvalid(spec,
                "data.token_shards.train_file: train.txt must end in "
                ".bin (raw uint16 token ids) or .npy");

  spec = TokenJob();
  spec.mutable_data()->mutable_token_shards()->set_vocab_size(12);
  ExpectInvalid(spec,
                "data.token_shards.vocab_size: 12 does not match the model's "
                "output width 11");

  spec = TokenJob();
  spec.mutable_data()->mutable_token_shards()->set_seq_len(5);
  ExpectInvalid(spec,
                "data.token_shards.seq_len: 5 does not match the model's "
                "input of 6 tokens");

  spec = TokenJob();
  spec.mutable_data()->mutable_token_shards()->set_seq_len(0);
  ExpectInvalid(spec, "data.token_shards.seq_len: 0 must lie in 1..");
}

}  // namespace
}  // namespace pipetrain
