// SchedulerCore's user actions on a job: pause, resume, cancel, evaluate,
// and the trace export. Each marks the job busy, talks to its stages
// without holding mu_, and ends through EndAction.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_progress.h"
#include "scheduler/job_state.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/stage_driver.h"
#include "scheduler/trace_export.h"

namespace pipetrain {
namespace {

v1::GetJobRequest MakeGetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return request;
}

}  // namespace

absl::StatusOr<JobRecord> SchedulerCore::BeginUserAction(
    const std::string& job_id, std::initializer_list<v1::JobState> states,
    const char* needs) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * r, jobs_.Find(job_id));
  const v1::JobState state = r->job.state();
  if (std::find(states.begin(), states.end(), state) == states.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " is ", v1::JobState_Name(state), "; ", needs));
  }
  if (r->busy) {
    return absl::UnavailableError(absl::StrCat(
        job_id, " is being started, stopped or evaluated; try again"));
  }
  r->busy = true;
  return *r;
}

absl::StatusOr<v1::Job> SchedulerCore::PauseJob(const v1::JobActionRequest& r) {
  ASSIGN_OR_RETURN(JobRecord record,
                   BeginUserAction(r.job_id(), {v1::JOB_STATE_RUNNING},
                                   "only a running job can be paused"));
  absl::StatusOr<int64_t> target =
      PauseStages(control_, record.Addresses(), r.job_id());
  if (!target.ok()) {
    EndAction(r.job_id(), std::nullopt);
    return target.status();
  }
  PT_LOG(INFO) << r.job_id() << " pauses at step " << *target;
  EndAction(r.job_id(), v1::JOB_STATE_PAUSED);
  return GetJob(MakeGetJob(r.job_id()));
}

absl::StatusOr<v1::Job> SchedulerCore::ResumeJob(
    const v1::JobActionRequest& r) {
  ASSIGN_OR_RETURN(JobRecord record,
                   BeginUserAction(r.job_id(), {v1::JOB_STATE_PAUSED},
                                   "only a paused job can be resumed"));
  const absl::Status resumed = ResumeStages(
      control_, record.Addresses(), r.job_id(), record.job.total_steps());
  if (!resumed.ok()) {
    EndAction(r.job_id(), std::nullopt);
    return resumed;
  }
  EndAction(r.job_id(), v1::JOB_STATE_RUNNING);
  return GetJob(MakeGetJob(r.job_id()));
}

absl::StatusOr<v1::Job> SchedulerCore::CancelJob(
    const v1::JobActionRequest& r) {
  // A PLANNING job that is not busy is a launch left by a previous
  // scheduler process; one being launched now is busy (try again).
  ASSIGN_OR_RETURN(
      JobRecord record,
      BeginUserAction(r.job_id(),
                      {v1::JOB_STATE_PENDING, v1::JOB_STATE_PLANNING,
                       v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED},
                      "it has already ended"));
  StopStages(control_, StageAddresses(r.job_id()), r.job_id());
  registry_.Release(r.job_id());
  EndAction(r.job_id(), v1::JOB_STATE_CANCELLED);
  return GetJob(MakeGetJob(r.job_id()));
}

absl::StatusOr<v1::EvalResult> SchedulerCore::Evaluate(
    const v1::EvaluateRequest& r) {
  ASSIGN_OR_RETURN(
      JobRecord record,
      BeginUserAction(
          r.job_id(), {v1::JOB_STATE_PAUSED, v1::JOB_STATE_COMPLETED},
          "evaluation runs through the job's stages, which must hold it and "
          "not be training (pause a running job first)"));
  absl::StatusOr<v1::EvalResult> eval =
      EvaluateStages(control_, record.Addresses(), r.job_id(), r.max_samples());
  if (!eval.ok()) {
    EndAction(r.job_id(), std::nullopt);
    return eval.status();
  }
  {
    absl::MutexLock lock(&mu_);
    JobRecord* live = *jobs_.Find(r.job_id());
    if (eval->step() == 0) eval->set_step(live->job.step());
    RecordEvaluation(*eval, live);
    jobs_.Save(*live);
  }
  EndAction(r.job_id(), std::nullopt);
  return *eval;
}

absl::StatusOr<v1::GetJobTraceResponse> SchedulerCore::GetJobTrace(
    const v1::GetJobTraceRequest& request) {
  v1::Plan plan;
  int64_t since = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobRecord * r, jobs_.Find(request.job_id()));
    if (!r->plan.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(request.job_id(), " has not started; no trace yet"));
    }
    plan = *r->plan;
    const int64_t last = request.last_steps() > 0 ? request.last_steps() : 5;
    since = std::max<int64_t>(0, r->job.step() - last);
  }
  ASSIGN_OR_RETURN(std::vector<v1::TraceEvent> events,
                   CollectTraces(control_, plan, request.job_id(), since));
  std::stable_sort(events.begin(), events.end(),
                   [](const v1::TraceEvent& a, const v1::TraceEvent& b) {
                     return a.start_unix_us() < b.start_unix_us();
                   });
  std::vector<TraceSpan> spans;
  for (const v1::TraceEvent& e : events) {
    ASSIGN_OR_RETURN(TraceSpan span, SpanFromEvent(e));
    spans.push_back(span);
  }
  v1::GetJobTraceResponse out;
  out.set_chrome_trace_json(ChromeTraceJson(plan, spans));
  for (v1::TraceEvent& e : events) *out.add_events() = std::move(e);
  return out;
}

}  // namespace pipetrain
