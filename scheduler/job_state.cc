#include "scheduler/job_state.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

bool IsTerminalJobState(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

bool IsLegalJobTransition(v1::JobState from, v1::JobState to) {
  switch (from) {
    case v1::JOB_STATE_PENDING:
      return to == v1::JOB_STATE_PLANNING || to == v1::JOB_STATE_CANCELLED;
    case v1::JOB_STATE_PLANNING:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_PENDING ||
             to == v1::JOB_STATE_FAILED || to == v1::JOB_STATE_CANCELLED;
    case v1::JOB_STATE_RUNNING:
      return to == v1::JOB_STATE_PAUSED || to == v1::JOB_STATE_COMPLETED ||
             to == v1::JOB_STATE_FAILED || to == v1::JOB_STATE_CANCELLED;
    case v1::JOB_STATE_PAUSED:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_CANCELLED;
    default:
      return false;  // final states, and values this build does not know
  }
}

absl::Status CheckJobTransition(v1::JobState from, v1::JobState to) {
  if (IsLegalJobTransition(from, to)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("a job cannot go from ", v1::JobState_Name(from), " to ",
                   v1::JobState_Name(to)));
}

}  // namespace pipetrain
