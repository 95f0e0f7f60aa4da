#include "scheduler/job_events.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain {

void AddJobEvent(v1::Job* job, v1::JobEventKind kind,
                 const std::string& message, int64_t now_ms,
                 const JobEventFields& fields) {
  v1::JobEvent* e = job->add_events();
  e->set_kind(kind);
  e->set_message(message);
  e->set_step(fields.step);
  e->set_version(fields.version);
  e->set_seconds(fields.seconds);
  e->set_unix_ms(now_ms);
  if (job->events_size() > kMaxJobEvents) {
    // Keep the first (submitted) event; drop the oldest after it.
    job->mutable_events()->DeleteSubrange(1, 1);
  }
}

std::string PlanSummary(const v1::Plan& plan) {
  std::string out = absl::StrCat(plan.stages_size(), " stages:");
  for (const v1::PlannedStage& s : plan.stages()) {
    absl::StrAppend(&out, s.stage() == 0 ? " " : ", ");
    if (s.chunks_size() > 0) {
      absl::StrAppend(&out, s.chunks_size(), " chunks");
    } else {
      absl::StrAppend(&out, "layers [", s.layer_begin(), ", ", s.layer_end(),
                      ")");
    }
    absl::StrAppend(&out, " on ", s.worker_id());
  }
  absl::StrAppend(&out, absl::StrFormat("; predicted step %.3g s",
                                        plan.predicted_step_seconds()));
  return out;
}

v1::JobEventKind EventForTransition(v1::JobState from, v1::JobState to) {
  switch (to) {
    case v1::JOB_STATE_RUNNING:
      return from == v1::JOB_STATE_PAUSED ? v1::JOB_EVENT_RESUMED
                                          : v1::JOB_EVENT_STARTED;
    case v1::JOB_STATE_PAUSED:
      return v1::JOB_EVENT_PAUSED;
    case v1::JOB_STATE_COMPLETED:
      return v1::JOB_EVENT_COMPLETED;
    case v1::JOB_STATE_FAILED:
      return v1::JOB_EVENT_FAILED;
    case v1::JOB_STATE_CANCELLED:
      return v1::JOB_EVENT_CANCELLED;
    default:
      return v1::JOB_EVENT_UNSPECIFIED;
  }
}

}  // namespace pipetrain
