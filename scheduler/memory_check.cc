#include "scheduler/memory_check.h"

#include "absl/strings/str_cat.h"
#include "spec/size_limits.h"

namespace pipetrain {

absl::Status CheckJobFitsWorkers(const v1::TrainingSpec& spec,
                                 const std::vector<v1::WorkerInfo>& workers) {
  // Whether a spec is valid is the scheduler's ModelSupport to say (it ran
  // at submit); one whose footprint cannot be estimated here is left to
  // the planner.
  const absl::StatusOr<JobFootprint> estimated = EstimateFootprint(spec);
  if (!estimated.ok()) return absl::OkStatus();
  const JobFootprint& need = *estimated;
  int64_t have = 0;
  for (const v1::WorkerInfo& w : workers) {
    if (w.memory_bytes() <= 0) return absl::OkStatus();  // unknown
    have += w.memory_bytes();
  }
  if (need.min_bytes <= have) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the job needs at least ", need.min_bytes, " bytes (", need.parameters,
      " parameters and their gradients, and a micro-batch activation of ",
      need.largest_activation_elements, " floats) but the ", workers.size(),
      " available workers have ", have, " bytes together"));
}

}  // namespace pipetrain
