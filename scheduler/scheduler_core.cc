#include "scheduler/scheduler_core.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_entry.h"

namespace pipetrain {
namespace {

bool Terminal(v1::JobState s) {
  return s == v1::JOB_STATE_COMPLETED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED;
}

}  // namespace

SchedulerCore::SchedulerCore(const SchedulerOptions& options,
                             StageControl* control, ModelSupport* model,
                             MetricsRegistry* metrics)
    : options_(options), control_(control), model_(model), metrics_(metrics) {}

absl::StatusOr<std::unique_ptr<SchedulerCore>> SchedulerCore::Create(
    const SchedulerOptions& options, StageControl* control, ModelSupport* model,
    MetricsRegistry* metrics) {
  std::unique_ptr<SchedulerCore> core(
      new SchedulerCore(options, control, model, metrics));
  RETURN_IF_ERROR(core->Init());
  core->thread_ = std::thread([c = core.get()] { c->Loop(); });
  core->ready_ = true;
  return core;
}

SchedulerCore::~SchedulerCore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status SchedulerCore::Init() {
  if (!options_.data_dir.empty()) {
    ASSIGN_OR_RETURN(store_, StateStore::Open(options_.data_dir));
  }
  registry_ = std::make_unique<WorkerRegistry>(options_.registry, store_.get());
  RETURN_IF_ERROR(registry_->Load(NowMs()));
  RegisterMetrics();
  if (store_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadJobs());
  std::lock_guard<std::mutex> lock(mu_);
  for (v1::Job& job : jobs) {
    auto entry = std::make_unique<JobEntry>();
    // Planning is redone from scratch; running jobs keep their stages,
    // which go on training while the scheduler is away.
    if (job.state() == v1::JOB_STATE_PLANNING) {
      job.set_state(v1::JOB_STATE_PENDING);
    }
    ASSIGN_OR_RETURN(std::optional<v1::Plan> plan, store_->LoadPlan(job.id()));
    if (plan.has_value()) {
      entry->plan = *plan;
      entry->has_plan = true;
      entry->reports.resize(plan->stages_size());
    }
    int64_t n = 0;
    if (sscanf(job.id().c_str(), "job-%ld", &n) == 1) {
      next_job_ = std::max(next_job_, n + 1);
    }
    entry->job = std::move(job);
    job_order_.push_back(entry->job.id());
    jobs_[entry->job.id()] = std::move(entry);
  }
  PT_LOG(INFO) << "scheduler state loaded: " << jobs_.size() << " jobs, "
               << registry_->List().size() << " workers";
  return absl::OkStatus();
}

void SchedulerCore::RegisterMetrics() {
  if (metrics_ == nullptr) return;
  auto workers = metrics_->AddCallbackGauge(
      "pipetrain_scheduler_workers", "Workers by state.", {"state"}, [this] {
        std::map<std::string, double> counts;
        for (int s = v1::WORKER_STATE_REGISTERED; s <= v1::WORKER_STATE_LOST;
             ++s) {
          counts[v1::WorkerState_Name(static_cast<v1::WorkerState>(s))] = 0;
        }
        for (const auto& w : registry_->List()) {
          counts[v1::WorkerState_Name(w.state())] += 1;
        }
        std::vector<GaugeSample> out;
        for (const auto& [state, n] : counts) out.push_back({{state}, n});
        return out;
      });
  auto jobs = metrics_->AddCallbackGauge(
      "pipetrain_scheduler_jobs", "Jobs by state.", {"state"}, [this] {
        std::map<std::string, double> counts;
        for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
          counts[v1::JobState_Name(static_cast<v1::JobState>(s))] = 0;
        }
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, e] : jobs_) {
          counts[v1::JobState_Name(e->job.state())] += 1;
        }
        std::vector<GaugeSample> out;
        for (const auto& [state, n] : counts) out.push_back({{state}, n});
        return out;
      });
  auto committed = metrics_->AddCallbackGauge(
      "pipetrain_scheduler_committed_version",
      "Weight version every stage of a running job has reached.", {"job"},
      [this] {
        std::vector<GaugeSample> out;
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, e] : jobs_) {
          if (e->job.state() == v1::JOB_STATE_RUNNING ||
              e->job.state() == v1::JOB_STATE_PAUSED) {
            out.push_back(
                {{id}, static_cast<double>(e->job.committed_version())});
          }
        }
        return out;
      });
  auto planning =
      metrics_->GetHistogram("pipetrain_scheduler_planning_seconds",
                             "Time to profile and plan a job's partition.",
                             ExponentialBuckets(0.001, 4, 8));
  for (const absl::Status& s : {workers, jobs, committed, planning.status()}) {
    if (!s.ok()) PT_LOG(ERROR) << "scheduler metrics: " << s;
  }
  if (planning.ok()) planning_seconds_ = *planning;
}

void SchedulerCore::PersistJob(const v1::Job& job) {
  if (store_ == nullptr) return;
  const absl::Status status = store_->PutJob(job);
  if (!status.ok())
    PT_LOG(ERROR) << "cannot persist " << job.id() << ": " << status;
}

void SchedulerCore::SetState(JobEntry* entry, v1::JobState state) {
  PT_LOG(INFO) << entry->job.id() << ": "
               << v1::JobState_Name(entry->job.state()) << " -> "
               << v1::JobState_Name(state);
  entry->job.set_state(state);
  entry->job.set_updated_unix_ms(NowMs());
  PersistJob(entry->job);
}

absl::StatusOr<SchedulerCore::JobEntry*> SchedulerCore::Find(
    const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  return it->second.get();
}

// ---- Workers ----

absl::StatusOr<v1::RegisterWorkerResponse> SchedulerCore::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  return registry_->Register(request.worker(), NowMs());
}

absl::StatusOr<v1::HeartbeatResponse> SchedulerCore::Heartbeat(
    const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse out;
  if (!registry_->Heartbeat(request.worker_id(), NowMs())) {
    out.set_register_again(true);
    return out;
  }
  if (request.has_report()) {
    std::lock_guard<std::mutex> lock(mu_);
    ApplyReport(request.worker_id(), request.report());
  }
  return out;
}

absl::StatusOr<v1::ListWorkersResponse> SchedulerCore::ListWorkers(
    const v1::ListWorkersRequest&) {
  v1::ListWorkersResponse out;
  for (v1::WorkerInfo& w : registry_->List()) *out.add_workers() = std::move(w);
  return out;
}

void SchedulerCore::ApplyReport(const std::string& worker_id,
                                const v1::StageReport& report) {
  auto it = jobs_.find(report.job_id());
  if (it == jobs_.end()) return;
  JobEntry* e = it->second.get();
  const int stage = report.stage();
  if (!e->has_plan || Terminal(e->job.state()) || stage < 0 ||
      stage >= e->plan.stages_size() ||
      e->plan.stages(stage).worker_id() != worker_id) {
    return;
  }
  const int k = e->plan.stages_size();
  const bool last = stage == k - 1;
  std::vector<v1::VersionEntry> ledger;
  for (const v1::StepResult& r : report.status().results()) {
    v1::VersionEntry v;
    v.set_stage(stage);
    v.set_step(r.step());
    v.set_weight_version(r.weight_version());
    v.set_unix_ms(NowMs());
    ledger.push_back(v);
    if (last) {
      e->job.set_loss(r.loss());
      e->job.set_accuracy(r.accuracy());
      e->recent_step_seconds.push_back(r.seconds());
      if (e->recent_step_seconds.size() > 20)
        e->recent_step_seconds.pop_front();
    }
    if (stage == 0) e->job.set_epoch(r.epoch());
  }
  if (!ledger.empty()) {
    auto& pending = pending_versions_[e->job.id()];
    pending.insert(pending.end(), ledger.begin(), ledger.end());
  }
  v1::StageReport& kept = e->reports[stage];
  kept = report;
  kept.mutable_status()->clear_results();
  // Progress: the slowest stage's step, the committed (minimum) version.
  int64_t step = INT64_MAX, committed = INT64_MAX;
  e->job.clear_stages();
  for (int s = 0; s < k; ++s) {
    const v1::StageReport& r = e->reports[s];
    step = std::min(step, r.status().next_step());
    committed = std::min(committed, r.status().weight_version());
    v1::StageProgress* p = e->job.add_stages();
    p->set_stage(s);
    p->set_worker_id(e->plan.stages(s).worker_id());
    p->set_next_step(r.status().next_step());
    p->set_weight_version(r.status().weight_version());
    p->set_busy_fraction(r.status().state() == v1::STAGE_STATE_RUNNING
                             ? 1.0 - r.status().idle_fraction()
                             : 0.0);
    p->set_forward_seconds(r.status().forward_seconds());
    p->set_backward_seconds(r.status().backward_seconds());
    p->set_peak_activation_bytes(r.status().peak_activation_bytes());
    p->set_stash_depth(r.status().stash_depth());
  }
  e->job.set_step(step);
  e->job.set_committed_version(committed);
  if (!e->recent_step_seconds.empty()) {
    double sum = 0;
    for (double s : e->recent_step_seconds) sum += s;
    const double mean = sum / e->recent_step_seconds.size();
    e->job.set_samples_per_second(
        mean > 0 ? e->job.spec().training().batch_size() / mean : 0);
  }
  e->job.set_updated_unix_ms(NowMs());
  if (!ledger.empty()) dirty_jobs_.insert(e->job.id());
}

void SchedulerCore::FlushProgress() {
  std::map<std::string, std::vector<v1::VersionEntry>> versions;
  std::vector<v1::Job> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    versions.swap(pending_versions_);
    for (const std::string& id : dirty_jobs_) jobs.push_back(jobs_.at(id)->job);
    dirty_jobs_.clear();
  }
  if (store_ == nullptr) return;
  for (const auto& [id, entries] : versions) {
    const absl::Status s = store_->AppendVersions(id, entries);
    if (!s.ok()) PT_LOG(ERROR) << "version ledger of " << id << ": " << s;
  }
  for (const v1::Job& job : jobs) PersistJob(job);
}

// ---- Users ----

absl::StatusOr<v1::Job> SchedulerCore::SubmitJob(
    const v1::SubmitJobRequest& request) {
  const v1::JobSpec& spec = request.spec();
  if (!spec.has_training()) {
    return absl::InvalidArgumentError("spec.training: missing");
  }
  RETURN_IF_ERROR(model_->Validate(spec.training()));
  if (spec.num_stages() < 0) {
    return absl::InvalidArgumentError("spec.num_stages: must be >= 0");
  }
  if (spec.num_stages() > spec.training().model().layers_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.num_stages: ", spec.num_stages(), " stages for a model of ",
        spec.training().model().layers_size(), " layers"));
  }
  const int alive = registry_->CountAlive();
  if (spec.num_stages() > alive) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job needs ", spec.num_stages(), " workers but only ",
                     alive, " are registered"));
  }
  if (spec.vertical_sync() && spec.schedule() != v1::SCHEDULE_ASYNC_1F1B) {
    return absl::InvalidArgumentError(
        "spec.vertical_sync: only applies to SCHEDULE_ASYNC_1F1B");
  }
  if (spec.schedule() == v1::SCHEDULE_INTERLEAVED) {
    const int v = spec.virtual_stages() > 0 ? spec.virtual_stages() : 2;
    const int k = spec.num_stages();
    const int64_t m = std::max<int64_t>(1, spec.training().micro_batches());
    if (v < 2) {
      return absl::InvalidArgumentError(
          "spec.virtual_stages: interleaving needs at least 2 chunks per "
          "worker");
    }
    if (k > 0 &&
        (m % k != 0 || spec.training().model().layers_size() < k * v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.num_stages: interleaving ", k, " workers x ", v,
                       " chunks needs micro_batches divisible by ", k,
                       " and at least ", k * v, " layers"));
    }
  } else if (spec.virtual_stages() > 1) {
    return absl::InvalidArgumentError(
        "spec.virtual_stages: only applies to SCHEDULE_INTERLEAVED");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto entry = std::make_unique<JobEntry>();
  v1::Job& job = entry->job;
  job.set_id(absl::StrCat("job-", next_job_++));
  job.set_name(spec.training().name().empty() ? job.id()
                                              : spec.training().name());
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_ms(NowMs());
  job.set_updated_unix_ms(job.created_unix_ms());
  job.set_total_steps(spec.training().steps());
  PersistJob(job);
  PT_LOG(INFO) << "submitted " << job.id() << " (" << job.name() << ")";
  v1::Job out = job;
  job_order_.push_back(job.id());
  jobs_[job.id()] = std::move(entry);
  cv_.notify_all();
  return out;
}

absl::StatusOr<v1::Job> SchedulerCore::GetJob(
    const v1::GetJobRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobEntry * e, Find(request.job_id()));
  return e->job;
}

absl::StatusOr<v1::ListJobsResponse> SchedulerCore::ListJobs(
    const v1::ListJobsRequest&) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListJobsResponse out;
  for (const std::string& id : job_order_) *out.add_jobs() = jobs_.at(id)->job;
  return out;
}

absl::StatusOr<v1::Plan> SchedulerCore::GetPlan(const v1::GetPlanRequest& r) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobEntry * e, Find(r.job_id()));
  if (!e->has_plan) {
    return absl::FailedPreconditionError(
        absl::StrCat(r.job_id(), " has no plan yet (state ",
                     v1::JobState_Name(e->job.state()), ")"));
  }
  return e->plan;
}

absl::StatusOr<v1::GetVersionsResponse> SchedulerCore::GetVersions(
    const v1::GetVersionsRequest& r) {
  FlushProgress();  // the history includes what heartbeats just reported
  v1::GetVersionsResponse out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(JobEntry * e, Find(r.job_id()));
    out.set_committed_version(e->job.committed_version());
    for (const auto& report : e->reports) {
      out.add_stage_versions(report.status().weight_version());
      out.add_stage_stash_depths(report.status().stash_depth());
    }
  }
  if (store_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<v1::VersionEntry> history,
                     store_->LoadVersions(r.job_id(), r.since_step()));
    for (v1::VersionEntry& v : history) *out.add_history() = std::move(v);
  }
  return out;
}

}  // namespace pipetrain
