// SchedulerCore's metrics: workers and jobs by state, committed versions,
// the latest evaluation of each job, planning time, recoveries, checkpoints.
// Gauges are computed at scrape time from the registry and the job table.
#include <map>

#include "common/logging.h"
#include "scheduler/scheduler_core.h"

namespace pipetrain {
namespace {

std::vector<GaugeSample> ToSamples(const std::map<std::string, double>& m) {
  std::vector<GaugeSample> out;
  for (const auto& [label, n] : m) out.push_back({{label}, n});
  return out;
}

}  // namespace

void SchedulerCore::RegisterMetrics() {
  if (metrics_ == nullptr) return;
  std::vector<absl::Status> results;
  results.push_back(metrics_->AddCallbackGauge(
      "pipetrain_scheduler_workers", "Workers by state.", {"state"},
      [this] { return WorkerStateSamples(); }));
  results.push_back(metrics_->AddCallbackGauge(
      "pipetrain_scheduler_jobs", "Jobs by state.", {"state"},
      [this] { return JobStateSamples(); }));
  results.push_back(metrics_->AddCallbackGauge(
      "pipetrain_scheduler_committed_version",
      "Weight version every stage of a running job has reached.", {"job"},
      [this] { return CommittedVersionSamples(); }));
  results.push_back(metrics_->AddCallbackGauge(
      "pipetrain_scheduler_eval_loss",
      "Held-out loss of the job's latest evaluation.", {"job"}, [this] {
        return EvalSamples([](const v1::EvalResult& e) { return e.loss(); });
      }));
  results.push_back(metrics_->AddCallbackGauge(
      "pipetrain_scheduler_eval_accuracy",
      "Held-out accuracy (0 to 1) of the job's latest evaluation.", {"job"},
      [this] {
        return EvalSamples(
            [](const v1::EvalResult& e) { return e.accuracy(); });
      }));
  auto planning =
      metrics_->GetHistogram("pipetrain_scheduler_planning_seconds",
                             "Time to profile and plan a job's partition.",
                             ExponentialBuckets(0.001, 4, 8));
  results.push_back(planning.status());
  auto recoveries = metrics_->GetCounter(
      "pipetrain_scheduler_recoveries_total",
      "Recoveries of jobs from lost workers or failed stages.");
  results.push_back(recoveries.status());
  if (recoveries.ok()) recoveries_ = *recoveries;
  auto recovery = metrics_->GetHistogram(
      "pipetrain_scheduler_recovery_seconds",
      "Time from a lost worker or failed stage to the next completed step.",
      ExponentialBuckets(0.25, 2, 10));
  results.push_back(recovery.status());
  if (recovery.ok()) recovery_seconds_ = *recovery;
  auto written = metrics_->GetCounter("pipetrain_scheduler_checkpoints_total",
                                      "Checkpoints committed.");
  results.push_back(written.status());
  if (written.ok()) checkpoints_written_ = *written;
  auto bytes =
      metrics_->GetCounter("pipetrain_scheduler_checkpoint_bytes_total",
                           "Bytes of committed checkpoints.");
  results.push_back(bytes.status());
  if (bytes.ok()) checkpoint_bytes_ = *bytes;
  auto seconds = metrics_->GetHistogram(
      "pipetrain_scheduler_checkpoint_seconds",
      "Time to fetch, write and commit a checkpoint (training goes on).",
      ExponentialBuckets(0.01, 4, 8));
  results.push_back(seconds.status());
  if (seconds.ok()) checkpoint_seconds_ = *seconds;
  for (const absl::Status& s : results) {
    if (!s.ok()) PT_LOG(ERROR) << "scheduler metrics: " << s;
  }
  if (planning.ok()) planning_seconds_ = *planning;
}

std::vector<GaugeSample> SchedulerCore::WorkerStateSamples() {
  std::map<std::string, double> counts;  // every state, even at 0
  for (int s = v1::WORKER_STATE_REGISTERED; s <= v1::WORKER_STATE_LOST; ++s) {
    counts[v1::WorkerState_Name(static_cast<v1::WorkerState>(s))] = 0;
  }
  for (const v1::WorkerInfo& w : registry_.List()) {
    counts[v1::WorkerState_Name(w.state())] += 1;
  }
  return ToSamples(counts);
}

std::vector<GaugeSample> SchedulerCore::JobStateSamples() {
  std::map<std::string, double> counts;  // every state, even at 0
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
    counts[v1::JobState_Name(static_cast<v1::JobState>(s))] = 0;
  }
  absl::MutexLock lock(&mu_);
  for (const std::string& id : jobs_.ids()) {
    counts[v1::JobState_Name((*jobs_.Find(id))->job.state())] += 1;
  }
  return ToSamples(counts);
}

std::vector<GaugeSample> SchedulerCore::CommittedVersionSamples() {
  std::vector<GaugeSample> out;
  absl::MutexLock lock(&mu_);
  for (const std::string& id : jobs_.ids()) {
    const v1::Job& job = (*jobs_.Find(id))->job;
    if (job.state() == v1::JOB_STATE_RUNNING ||
        job.state() == v1::JOB_STATE_PAUSED) {
      out.push_back({{id}, static_cast<double>(job.committed_version())});
    }
  }
  return out;
}

// The latest evaluation (periodic, on request or final) of every job that
// has one.
std::vector<GaugeSample> SchedulerCore::EvalSamples(
    double (*value)(const v1::EvalResult&)) {
  std::vector<GaugeSample> out;
  absl::MutexLock lock(&mu_);
  for (const std::string& id : jobs_.ids()) {
    const v1::Job& job = (*jobs_.Find(id))->job;
    if (job.evaluations_size() > 0) out.push_back({{id}, value(job.eval())});
  }
  return out;
}

}  // namespace pipetrain
