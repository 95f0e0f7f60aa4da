// SchedulerCore's metrics: workers and jobs by state, committed versions,
// the latest evaluation of each job, planning time. Gauges are computed at
// scrape time from the registry and the job table.
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
