#include "scheduler/job_progress.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "scheduler/job_events.h"
#include "scheduler/job_state.h"

namespace pipetrain {
namespace {

// Step times kept for the throughput estimate.
constexpr size_t kRecentSteps = 20;

std::vector<v1::VersionEntry> LedgerOf(const v1::StageReport& report,
                                       int64_t now_ms) {
  std::vector<v1::VersionEntry> out;
  for (const v1::StepResult& r : report.status().results()) {
    v1::VersionEntry v;
    v.set_stage(report.stage());
    v.set_step(r.step());
    v.set_weight_version(r.weight_version());
    v.set_unix_ms(now_ms);
    out.push_back(v);
  }
  return out;
}

// `report` without the results an earlier report of its stage and
// configuration brought (a worker repeats them until they are on disk).
v1::StageReport NewResults(const v1::StageReport& report, JobRecord* record) {
  const size_t stage = static_cast<size_t>(report.stage());
  if (record->results_taken.size() <= stage) {
    record->results_taken.resize(stage + 1);
  }
  JobRecord::ResultsTaken& taken = record->results_taken[stage];
  if (taken.attempt != report.attempt()) taken = {report.attempt(), 0};
  v1::StageReport fresh = report;
  fresh.mutable_status()->clear_results();
  for (const v1::StepResult& r : report.status().results()) {
    if (r.step() < taken.next_step) continue;
    *fresh.mutable_status()->add_results() = r;
    taken.next_step = r.step() + 1;
  }
  return fresh;
}

// Loss, accuracy and step times come from the last stage, the epoch from
// stage 0.
void TakeStepResults(const v1::StageReport& report, bool last,
                     JobRecord* record) {
  v1::Job& job = record->job;
  for (const v1::StepResult& r : report.status().results()) {
    if (last) {
      job.set_loss(r.loss());
      job.set_accuracy(r.accuracy());
      record->recent_step_seconds.push_back(r.seconds());
      if (record->recent_step_seconds.size() > kRecentSteps) {
        record->recent_step_seconds.pop_front();
      }
    }
    if (report.stage() == 0) job.set_epoch(r.epoch());
  }
}

int TakeEvaluations(const v1::StageReport& report, JobRecord* record) {
  int added = 0;
  for (const v1::EvalResult& e : report.status().evaluations()) {
    if (e.step() <= record->last_reported_eval_step) continue;
    record->last_reported_eval_step = e.step();
    RecordEvaluation(e, record);
    ++added;
  }
  return added;
}

v1::StageProgress ProgressOf(const v1::StageReport& r, int stage,
                             const std::string& worker_id) {
  const v1::GetStatusResponse& st = r.status();
  v1::StageProgress p;
  p.set_stage(stage);
  p.set_worker_id(worker_id);
  p.set_next_step(st.next_step());
  p.set_weight_version(st.weight_version());
  p.set_busy_fraction(
      st.state() == v1::STAGE_STATE_RUNNING ? 1.0 - st.idle_fraction() : 0.0);
  p.set_forward_seconds(st.forward_seconds());
  p.set_backward_seconds(st.backward_seconds());
  p.set_peak_activation_bytes(st.peak_activation_bytes());
  p.set_stash_depth(st.stash_depth());
  return p;
}

// Job-wide figures from the latest report of every stage: the slowest
// stage's step, the committed (minimum) version, the throughput.
void Summarize(JobRecord* record) {
  v1::Job& job = record->job;
  int64_t step = INT64_MAX, committed = INT64_MAX;
  job.clear_stages();
  for (size_t s = 0; s < record->reports.size(); ++s) {
    const v1::StageReport& r = record->reports[s];
    step = std::min(step, r.status().next_step());
    committed = std::min(committed, r.status().weight_version());
    *job.add_stages() =
        ProgressOf(r, static_cast<int>(s), record->plan->stages(s).worker_id());
  }
  job.set_step(step);
  job.set_committed_version(committed);
  if (record->recent_step_seconds.empty()) return;
  double sum = 0;
  for (double s : record->recent_step_seconds) sum += s;
  const double mean = sum / record->recent_step_seconds.size();
  job.set_samples_per_second(
      mean > 0 ? job.spec().training().batch_size() / mean : 0);
}

// The recovery in progress ends when the last stage completed a step at or
// after the one the stages resumed at.
double EndRecovery(const v1::StageReport& report, int64_t now_ms,
                   JobRecord* record) {
  if (record->resume_step < 0) return -1;
  bool stepped = false;
  for (const v1::StepResult& r : report.status().results()) {
    stepped = stepped || r.step() >= record->resume_step;
  }
  if (!stepped) return -1;
  if (record->resuming_after_growth) {
    // A growth is no recovery: its event was logged when it began.
    record->resuming_after_growth = false;
    record->resume_step = -1;
    return -1;
  }
  const double seconds = (now_ms - record->recovering_since_ms) / 1000.0;
  const v1::VersionRollback* rollback =
      record->job.rollbacks().empty() ? nullptr
                                      : &*record->job.rollbacks().rbegin();
  const int64_t version = rollback != nullptr ? rollback->version() : 0;
  AddJobEvent(&record->job, v1::JOB_EVENT_RECOVERED,
              absl::StrCat("resumed at step ", record->resume_step,
                           " from version ", version),
              now_ms, {record->resume_step, version, seconds});
  record->resume_step = -1;
  record->recovering_since_ms = 0;
  return seconds;
}

}  // namespace

ReportEffects ApplyStageReport(const std::string& worker_id,
                               const v1::StageReport& report, int64_t now_ms,
                               JobRecord* record) {
  ReportEffects effects;
  const int stage = report.stage();
  if (!record->plan.has_value() || IsTerminalJobState(record->job.state()) ||
      report.job_id() != record->job.id() || stage < 0 ||
      stage >= record->plan->stages_size() ||
      record->plan->stages(stage).worker_id() != worker_id ||
      report.attempt() != record->job.attempt()) {
    return effects;
  }
  effects.applied = true;
  const bool last = stage == record->plan->stages_size() - 1;
  const v1::StageReport fresh = NewResults(report, record);
  effects.ledger = LedgerOf(fresh, now_ms);
  TakeStepResults(fresh, last, record);
  if (last) effects.recovery_seconds = EndRecovery(fresh, now_ms, record);
  // Only the last stage computes the loss, so only it evaluates.
  if (last) effects.new_evaluations = TakeEvaluations(report, record);
  v1::StageReport& kept = record->reports[stage];
  kept = report;
  kept.mutable_status()->clear_results();
  kept.mutable_status()->clear_evaluations();
  Summarize(record);
  record->job.set_updated_unix_ms(now_ms);
  return effects;
}

void RecordEvaluation(const v1::EvalResult& eval, JobRecord* record) {
  *record->job.add_evaluations() = eval;
  *record->job.mutable_eval() = eval;
}

std::optional<std::string> JobFailure(
    const std::map<std::string, v1::WorkerInfo>& workers, int64_t now_ms,
    int64_t grace_ms, JobRecord* record) {
  if (!record->plan.has_value()) return std::nullopt;
  const std::string& id = record->job.id();
  std::optional<std::string> stage_failure;
  bool unreachable = false;
  for (int s = 0; s < record->plan->stages_size(); ++s) {
    const std::string& worker_id = record->plan->stages(s).worker_id();
    auto w = workers.find(worker_id);
    if (w == workers.end() || w->second.state() == v1::WORKER_STATE_LOST) {
      return absl::StrCat("worker ", worker_id, " of stage ", s, " was lost");
    }
    if (w->second.job_id() != id) {
      return absl::StrCat("worker ", worker_id, " of stage ", s,
                          " no longer runs this job (it restarted)");
    }
    const v1::StageReport& r = record->reports[s];
    if (!stage_failure.has_value() && r.job_id() == id &&
        r.status().state() == v1::STAGE_STATE_FAILED) {
      stage_failure =
          absl::StrCat("stage ", s, " failed: ", r.status().error());
      unreachable = r.status().error_code() ==
                    static_cast<int>(absl::StatusCode::kUnavailable);
    }
  }
  if (!stage_failure.has_value() || !unreachable) return stage_failure;
  if (record->unreachable_since_ms == 0) record->unreachable_since_ms = now_ms;
  if (now_ms - record->unreachable_since_ms < grace_ms) return std::nullopt;
  return stage_failure;
}

std::optional<std::string> ReattachFailure(int64_t now_ms, JobRecord* record) {
  if (record->reattach_by_ms == 0 || !record->plan.has_value()) {
    return std::nullopt;
  }
  const v1::Job& job = record->job;
  std::optional<std::string> missing;
  for (size_t s = 0; s < record->reports.size() && !missing; ++s) {
    const v1::StageReport& r = record->reports[s];
    const v1::StageState state = r.status().state();
    const bool expected = state == v1::STAGE_STATE_RUNNING ||
                          state == v1::STAGE_STATE_DONE ||
                          (state == v1::STAGE_STATE_CONFIGURED &&
                           job.state() == v1::JOB_STATE_PAUSED);
    // ApplyStageReport keeps only reports of the current configuration.
    if (r.job_id() != job.id()) {
      missing = absl::StrCat("stage ", s, " has not reported on this job");
    } else if (!expected) {
      missing = absl::StrCat("stage ", s, " is ", v1::StageState_Name(state));
    }
  }
  if (!missing.has_value()) {
    record->reattach_by_ms = 0;
    return std::nullopt;
  }
  if (now_ms < record->reattach_by_ms) return std::nullopt;
  record->reattach_by_ms = 0;
  return absl::StrCat(
      "could not re-attach to the stages after a scheduler "
      "restart: ",
      *missing);
}

bool StagesDone(const JobRecord& record) {
  if (!record.plan.has_value() || record.job.state() != v1::JOB_STATE_RUNNING) {
    return false;
  }
  for (const v1::StageReport& r : record.reports) {
    if (r.job_id() != record.job.id() ||
        r.status().state() != v1::STAGE_STATE_DONE ||
        r.status().next_step() < record.job.total_steps()) {
      return false;
    }
  }
  return !record.reports.empty();
}

}  // namespace pipetrain
