// Training specs are checked field by field, and their model by the shape
// rules; errors name the field.
#include "spec/training_spec.h"

#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

v1::TrainingSpec Valid() {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(R"({
    "model": {
      "inputKind": "INPUT_KIND_FLOAT", "inputShape": [6],
      "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
      "layers": [{"linear": {"inFeatures": 6, "outFeatures": 3}}]},
    "optimizer": {"sgd": {"lr": 0.1}},
    "batchSize": 16, "microBatches": 4, "steps": 3})",
                                        &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

void ExpectInvalid(const v1::TrainingSpec& spec, const std::string& field) {
  const absl::Status status = ValidateTrainingSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(status.message(), HasSubstr(field));
}

TEST(TrainingSpec, ChecksItsFieldsAndItsModel) {
  EXPECT_TRUE(ValidateTrainingSpec(Valid()).ok());
  v1::TrainingSpec spec = Valid();
  spec.set_micro_batches(0);  // means 1
  EXPECT_TRUE(ValidateTrainingSpec(spec).ok());
  spec.set_steps(0);
  spec.set_epochs(2);
  EXPECT_TRUE(ValidateTrainingSpec(spec).ok());

  spec = Valid();
  spec.set_batch_size(0);
  ExpectInvalid(spec, "batch_size");
  spec = Valid();
  spec.set_micro_batches(3);  // does not divide 16
  ExpectInvalid(spec, "micro_batches");
  spec = Valid();
  spec.set_micro_batches(-2);
  ExpectInvalid(spec, "micro_batches");
  spec = Valid();
  spec.set_steps(0);
  ExpectInvalid(spec, "steps / epochs");
  spec = Valid();
  spec.set_epochs(-1);
  ExpectInvalid(spec, "epochs");
  spec = Valid();
  spec.set_eval_every(-5);
  ExpectInvalid(spec, "eval_every");
  spec = Valid();
  spec.set_checkpoint_every(-1);  // off
  spec.set_max_restarts(-1);      // none
  EXPECT_TRUE(ValidateTrainingSpec(spec).ok());
  spec.set_checkpoint_every(-2);
  ExpectInvalid(spec, "checkpoint_every");
  spec = Valid();
  spec.set_keep_checkpoints(-1);
  ExpectInvalid(spec, "keep_checkpoints");
  spec = Valid();
  spec.set_max_restarts(-3);
  ExpectInvalid(spec, "max_restarts");
  spec = Valid();
  spec.set_init_from("model.safetensors");
  EXPECT_TRUE(ValidateTrainingSpec(spec).ok());
  spec.set_init_from("job:job-1@0");
  ExpectInvalid(spec, "init_from");
  spec = Valid();
  spec.clear_model();
  ExpectInvalid(spec, "model");
  spec = Valid();
  spec.mutable_model()->mutable_layers(0)->mutable_linear()->set_in_features(5);
  ExpectInvalid(spec, "layers[0].linear.in_features");
}

}  // namespace
}  // namespace pipetrain
