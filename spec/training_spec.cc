#include "spec/training_spec.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/dataset_spec.h"
#include "spec/init_from.h"
#include "spec/model_spec.h"
#include "spec/size_limits.h"

namespace pipetrain {

namespace {

// Checkpoint, restart and initialisation fields: each has one meaning for
// 0 (the default) and for -1 (off); anything else below is a mistake.
absl::Status ValidateDurabilityFields(const v1::TrainingSpec& spec) {
  if (spec.checkpoint_every() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_every: ", spec.checkpoint_every(),
                     " must be > 0 (steps), 0 (about every 60 s) or -1 (off)"));
  }
  if (spec.keep_checkpoints() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_checkpoints: ", spec.keep_checkpoints(),
                     " must be > 0, or 0 for the default of 3"));
  }
  if (spec.max_restarts() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts: ", spec.max_restarts(),
                     " must be >= 0 (0: the default of 10) or -1 (none)"));
  }
  if (!spec.init_from().empty()) {
    // Syntax only here; whether the file or checkpoint exists and fits the
    // model is the scheduler's to check (it holds them).
    RETURN_IF_ERROR(ParseInitFrom(spec.init_from()).status());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrainingSpec(const v1::TrainingSpec& spec) {
  if (spec.batch_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec.batch_size(), " must be > 0"));
  }
  if (spec.batch_size() > kMaxBatchSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec.batch_size(),
                     " exceeds the limit of ", kMaxBatchSize, " samples"));
  }
  const int64_t m = spec.micro_batches() == 0 ? 1 : spec.micro_batches();
  if (m < 0 || spec.batch_size() % m != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches: ", m,
                     " must be > 0 and divide batch_size ", spec.batch_size()));
  }
  if (spec.steps() < 0 || spec.epochs() < 0) {
    return absl::InvalidArgumentError("steps and epochs must be >= 0");
  }
  if (spec.steps() == 0 && spec.epochs() == 0) {
    return absl::InvalidArgumentError(
        "steps / epochs: set how long to train (steps > 0 or epochs > 0)");
  }
  if (spec.eval_every() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_every: ", spec.eval_every(), " must be >= 0"));
  }
  RETURN_IF_ERROR(ValidateDurabilityFields(spec));
  if (!spec.has_model()) {
    return absl::InvalidArgumentError("model: missing");
  }
  RETURN_IF_ERROR(ValidateDatasetSpec(spec.data()));
  // The model's shapes, then every micro-batch activation they imply.
  RETURN_IF_ERROR(EstimateFootprint(spec).status());
  return ValidateDatasetFitsModel(spec);
}

}  // namespace pipetrain
