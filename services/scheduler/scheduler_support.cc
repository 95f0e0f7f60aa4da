#include "services/scheduler/scheduler_support.h"

#include <algorithm>

#include "common/logging.h"
#include "spec/job_spec.h"
#include "spec/training_spec.h"

namespace pipetrain {

absl::Status SpecModelSupport::Validate(const v1::TrainingSpec& spec) {
  return ValidateTrainingSpec(spec);
}

double SpecModelSupport::TheoreticalBubble(const v1::JobSpec& spec,
                                           int num_stages) {
  const absl::StatusOr<double> bubble =
      JobTheoreticalBubble(spec, std::max(1, num_stages));
  if (bubble.ok()) return *bubble;
  // Only an unknown schedule gets here, and its stages refuse to train; the
  // bubble is only reported, so log it rather than fail here.
  PT_LOG(ERROR) << "theoretical bubble of an accepted job: " << bubble.status();
  return 0.0;
}

}  // namespace pipetrain
