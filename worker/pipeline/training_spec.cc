#include "worker/pipeline/training_spec.h"

#include "absl/strings/str_cat.h"
#include "worker/nn/model.h"

namespace pipetrain {

absl::Status ValidateTrainingSpec(const v1::TrainingSpec& spec) {
  if (spec.batch_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec.batch_size(), " must be > 0"));
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
  if (!spec.has_model()) {
    return absl::InvalidArgumentError("model: missing");
  }
  return ValidateModelSpec(spec.model()).status();
}

}  // namespace pipetrain
