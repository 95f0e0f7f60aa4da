// SchedulerCore: construction, restart recovery, and the calls network
// handlers make (workers, submit, get, list). The control loop and its
// actions are in job_lifecycle.cc, user actions on jobs in job_actions.cc,
// metrics in scheduler_metrics.cc.
#include "scheduler/scheduler_core.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/median.h"
#include "common/secret.h"
#include "common/status_macros.h"
#include "scheduler/job_progress.h"
#include "scheduler/job_state.h"
#include "scheduler/plan_builder.h"

namespace pipetrain {
namespace {

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A name for this run of the scheduler: random, or the start time when the
// system's random source fails (any value that changes between runs does).
std::string NewInstanceName() {
  absl::StatusOr<std::string> random = RandomSecret(8);
  return random.ok() ? *random : absl::StrCat("t", SystemNowMs());
}

}  // namespace

SchedulerCore::SchedulerCore(const SchedulerOptions& options,
                             StageControl* control, ModelSupport* model,
                             MetricsRegistry* metrics,
                             std::unique_ptr<StateStore> store)
    : options_(options),
      instance_(NewInstanceName()),
      control_(control),
      model_(model),
      metrics_(metrics),
      store_(std::move(store)),
      writer_(store_.get()),
      registry_(options.registry, &writer_),
      jobs_(&writer_) {}

absl::StatusOr<std::unique_ptr<SchedulerCore>> SchedulerCore::Create(
    const SchedulerOptions& options, StageControl* control, ModelSupport* model,
    MetricsRegistry* metrics) {
  std::unique_ptr<StateStore> store;
  if (!options.data_dir.empty()) {
    ASSIGN_OR_RETURN(store, StateStore::Open(options.data_dir));
  }
  std::unique_ptr<SchedulerCore> core(
      new SchedulerCore(options, control, model, metrics, std::move(store)));
  RETURN_IF_ERROR(core->Init());
  if (options.control_thread) {
    core->thread_ = std::thread([c = core.get()] { c->Loop(); });
  }
  core->ready_ = true;
  return core;
}

SchedulerCore::~SchedulerCore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
  actions_.WaitIdle();
  Flush();
}

absl::Status SchedulerCore::Init() {
  RegisterMetrics();
  if (store_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<v1::WorkerInfo> workers, store_->LoadWorkers());
  // Workers get one extra lease to find a restarted scheduler (its own
  // start, their reconnect backoff) before they count as lost.
  registry_.Load(
      std::move(workers),
      Now() + static_cast<int64_t>(1000.0 * options_.registry.lease_seconds));
  RETURN_IF_ERROR(RestoreJobs());
  Flush();
  return absl::OkStatus();
}

// Jobs keep their state: running ones are followed through their workers'
// heartbeats (stages train on while the scheduler is away) or, when their
// stages cannot be re-attached, recovered; a PLANNING one
// is reset by the first tick. Workers assigned to a job that no longer runs
// (a crash between ending the job and freeing them) are freed.
absl::Status SchedulerCore::RestoreJobs() {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadJobs());
  std::map<std::string, v1::Plan> plans;
  std::map<std::string, v1::JobState> states;
  for (const v1::Job& job : jobs) {
    states[job.id()] = job.state();
    ASSIGN_OR_RETURN(std::optional<v1::Plan> plan, store_->LoadPlan(job.id()));
    if (plan.has_value()) plans[job.id()] = std::move(*plan);
  }
  {
    absl::MutexLock lock(&mu_);
    jobs_.Restore(std::move(jobs), std::move(plans));
    for (const std::string& id : jobs_.ids())
      FollowRestoredJob(*jobs_.Find(id));
  }
  for (const v1::WorkerInfo& w : registry_.List()) {
    if (w.job_id().empty()) continue;
    auto state = states.find(w.job_id());
    if (state == states.end() || IsTerminalJobState(state->second)) {
      PT_LOG(INFO) << "worker " << w.id() << " was left assigned to "
                   << w.job_id() << "; freeing it";
      registry_.Release(w.job_id());
    }
  }
  PT_LOG(INFO) << "scheduler state loaded: " << states.size() << " jobs, "
               << registry_.List().size() << " workers";
  return absl::OkStatus();
}

// A running or paused job's stages are re-attached from their heartbeats
// (ReattachFailure gives them a few leases); checkpoints go on after the
// last committed one, so no boundary is fetched twice.
void SchedulerCore::FollowRestoredJob(JobRecord* r) {
  const v1::JobState state = r->job.state();
  if (state != v1::JOB_STATE_RUNNING && state != v1::JOB_STATE_PAUSED) return;
  if (!r->plan.has_value()) return;
  r->reattach_by_ms = Now() + 2 * FailureGraceMs();
  r->last_checkpoint_ms = Now();
  if (options_.checkpoints == nullptr) return;
  absl::StatusOr<CheckpointInfo> latest =
      options_.checkpoints->Latest(r->job.id());
  if (latest.ok()) r->last_checkpoint_step = latest->step;
}

void SchedulerCore::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    Tick();
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    wake_.WaitWithTimeout(&mu_, absl::Seconds(options_.tick_seconds));
  }
}

int64_t SchedulerCore::Now() const {
  return options_.now_ms ? options_.now_ms() : SystemNowMs();
}

int64_t SchedulerCore::FailureGraceMs() const {
  return static_cast<int64_t>(
      1000.0 * (options_.registry.lease_seconds + options_.tick_seconds));
}

void SchedulerCore::Flush() {
  const absl::Status status = writer_.Flush();
  if (!status.ok()) PT_LOG(ERROR) << "scheduler state not written: " << status;
}

// ---- Workers ----

absl::StatusOr<v1::RegisterWorkerResponse> SchedulerCore::RegisterWorker(
    const v1::RegisterWorkerRequest& request,
    const WorkerAdmission& admission) {
  return registry_.Register(request.worker(), Now(), admission);
}

absl::StatusOr<v1::HeartbeatResponse> SchedulerCore::Heartbeat(
    const v1::HeartbeatRequest& request, const std::string& identity) {
  v1::HeartbeatResponse out;
  out.set_scheduler_instance(instance_);
  out.set_durable_sequence(writer_.durable_sequence());
  const int64_t now = Now();
  const absl::Status caller = registry_.CheckCaller(
      request.worker_id(), identity, request.worker_secret());
  if (caller.code() == absl::StatusCode::kPermissionDenied) {
    PT_LOG(WARNING) << "refused a heartbeat: " << caller.message();
    return caller;
  }
  if (!caller.ok() || !registry_.Heartbeat(request.worker_id(), now)) {
    out.set_register_again(true);
    return out;
  }
  if (request.links_size() > 0) {
    registry_.RecordLinks(request.worker_id(), request.links(), now);
  }
  for (v1::ProbeTarget& t : registry_.ProbesFor(request.worker_id(), now)) {
    *out.add_probe() = std::move(t);
  }
  if (!request.has_report()) return out;
  bool recovered = false;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobRecord*> record = jobs_.Find(request.report().job_id());
    if (!record.ok()) return out;
    const ReportEffects effects =
        ApplyStageReport(request.worker_id(), request.report(), now, *record);
    if (!effects.ledger.empty()) {
      writer_.AppendVersions((*record)->job.id(), effects.ledger);
    }
    // Results this report repeats were queued earlier, so an applied report
    // waits for everything queued so far (see HeartbeatResponse).
    if (effects.applied) out.set_report_sequence(writer_.queued_sequence());
    recovered = effects.recovery_seconds >= 0;
    if (recovered && recovery_seconds_ != nullptr) {
      recovery_seconds_->Observe(effects.recovery_seconds);
    }
    if (!effects.ledger.empty() || effects.new_evaluations > 0 || recovered) {
      jobs_.Save(**record);
    }
  }
  // A recovery's end (its RECOVERED event) is written now, not at the next
  // tick: a scheduler killed within a tick of it lost the event (the chaos
  // test saw two of three). Recoveries are rare, so this heartbeat waits
  // one write and the others none.
  if (recovered) Flush();
  out.set_durable_sequence(writer_.durable_sequence());
  return out;
}

absl::StatusOr<v1::ListWorkersResponse> SchedulerCore::ListWorkers(
    const v1::ListWorkersRequest&) {
  v1::ListWorkersResponse out;
  std::vector<v1::WorkerInfo> workers = registry_.List();
  ApplyLinkOverrides(options_.topology, &workers);
  for (v1::WorkerInfo& w : workers) *out.add_workers() = std::move(w);
  return out;
}

absl::StatusOr<v1::RemoveWorkerResponse> SchedulerCore::RemoveWorker(
    const v1::RemoveWorkerRequest& request) {
  RETURN_IF_ERROR(registry_.Remove(request.worker_id()));
  PT_LOG(INFO) << "worker " << request.worker_id() << " removed";
  return v1::RemoveWorkerResponse();
}

// ---- Users ----

absl::StatusOr<v1::Job> SchedulerCore::SubmitJob(
    const v1::SubmitJobRequest& request) {
  const v1::JobSpec& spec = request.spec();
  if (!spec.has_training()) {
    return absl::InvalidArgumentError("spec.training: missing");
  }
  RETURN_IF_ERROR(model_->Validate(spec.training()));
  RETURN_IF_ERROR(CheckJobSpec(spec, registry_.CountAlive()));
  // A bad initFrom is the submitter's to fix now, not a failed job later
  // (the source is read again when the job starts).
  if (!spec.training().init_from().empty()) {
    RETURN_IF_ERROR(LoadInitFrom(spec).status());
  }
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    out = jobs_.Add(spec, Now())->job;
  }
  // An acknowledged job survives a crash: write it before answering. The
  // flush runs outside mu_, so heartbeats never wait on this fsync.
  if (absl::Status saved = writer_.Flush(); !saved.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "job ", out.id(), " could not be saved; try again: ", saved.message()));
  }
  PT_LOG(INFO) << "submitted " << out.id() << " (" << out.name() << ")";
  wake_.SignalAll();  // the control loop starts it promptly
  return out;
}

absl::StatusOr<v1::Job> SchedulerCore::GetJob(
    const v1::GetJobRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * record, jobs_.Find(request.job_id()));
  return record->job;
}

absl::StatusOr<v1::ListJobsResponse> SchedulerCore::ListJobs(
    const v1::ListJobsRequest&) {
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse out;
  for (const std::string& id : jobs_.ids()) {
    *out.add_jobs() = (*jobs_.Find(id))->job;
  }
  return out;
}

absl::StatusOr<v1::Plan> SchedulerCore::GetPlan(const v1::GetPlanRequest& r) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * record, jobs_.Find(r.job_id()));
  if (!record->plan.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(r.job_id(), " has no plan yet (state ",
                     v1::JobState_Name(record->job.state()), ")"));
  }
  v1::Plan plan = *record->plan;
  // Predicted beside measured: the median of the last stage's recent steps.
  std::vector<double> steps(record->recent_step_seconds.begin(),
                            record->recent_step_seconds.end());
  if (!steps.empty()) {
    plan.set_measured_step_seconds(Median(steps));
    plan.set_measured_steps(static_cast<int64_t>(steps.size()));
  }
  return plan;
}

absl::StatusOr<v1::GetVersionsResponse> SchedulerCore::GetVersions(
    const v1::GetVersionsRequest& r) {
  v1::GetVersionsResponse out;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobRecord * record, jobs_.Find(r.job_id()));
    out.set_committed_version(record->job.committed_version());
    *out.mutable_rollbacks() = record->job.rollbacks();
    for (const v1::StageReport& report : record->reports) {
      out.add_stage_versions(report.status().weight_version());
      out.add_stage_stash_depths(report.status().stash_depth());
    }
  }
  if (store_ == nullptr) return out;
  Flush();  // the history includes what heartbeats just reported
  ASSIGN_OR_RETURN(std::vector<v1::VersionEntry> history,
                   store_->LoadVersions(r.job_id(), r.since_step()));
  for (v1::VersionEntry& v : history) *out.add_history() = std::move(v);
  return out;
}

}  // namespace pipetrain
