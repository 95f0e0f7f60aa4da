// SchedulerCore's control loop and the actions it takes on jobs: starting
// pending jobs, finishing done ones (evaluation through the pipeline; a
// failed one is recovered from the latest checkpoint and evaluated again),
// failing broken ones and resetting a launch a previous scheduler process
// left half done.
#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_events.h"
#include "scheduler/job_progress.h"
#include "scheduler/memory_check.h"
#include "scheduler/plan_builder.h"
#include "scheduler/recovery_plan.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/stage_driver.h"
#include "scheduler/worker_kinds.h"

namespace pipetrain {
namespace {

// A failure that ends a job: the reason, and the restarts spent on it when
// the job could restart at all.
std::string GiveUpReason(const v1::Job& job, const std::string& why) {
  if (MaxRestarts(job.spec()) == 0) return why;
  return absl::StrCat(why, " (gave up after ", job.restarts(), " restarts)");
}

}  // namespace

void SchedulerCore::Tick() {
  registry_.Sweep(Now());
  Flush();
  std::map<std::string, v1::WorkerInfo> workers;
  for (v1::WorkerInfo& w : registry_.List()) workers[w.id()] = std::move(w);
  std::vector<Action> actions;
  {
    absl::MutexLock lock(&mu_);
    actions = ChooseActions(workers);
  }
  for (const Action& action : actions) {
    if (options_.action_threads) {
      actions_.Post([this, action] { RunAction(action); });
    } else {
      RunAction(action);
    }
  }
}

void SchedulerCore::WaitForActions() { actions_.WaitIdle(); }

// Failing, finishing and resetting come before starting: they free workers
// a start can use.
std::vector<SchedulerCore::Action> SchedulerCore::ChooseActions(
    const std::map<std::string, v1::WorkerInfo>& workers) {
  std::vector<Action> out;
  bool pending = false;
  for (const std::string& id : jobs_.ids()) {
    JobRecord* r = *jobs_.Find(id);
    if (r->busy) continue;
    const v1::JobState state = r->job.state();
    if (state == v1::JOB_STATE_PENDING) {
      pending = true;
    } else if (state == v1::JOB_STATE_PLANNING) {
      // Launches hold the job busy: an idle PLANNING job was being
      // launched by a scheduler process that is gone.
      r->busy = true;
      out.push_back({ActionKind::kReset, id, ""});
    } else if (state == v1::JOB_STATE_RUNNING ||
               state == v1::JOB_STATE_PAUSED) {
      if (r->recover_why.has_value() && !r->unreachable_worker.empty()) {
        if (!UnreachableWorkerSettled(workers, r->unreachable_worker,
                                      r->unreachable_worker_ms)) {
          continue;  // its lease decides: lost, or alive after all
        }
        r->unreachable_worker.clear();
      }
      std::optional<std::string> why = r->recover_why;
      if (!why.has_value())
        why = JobFailure(workers, Now(), FailureGraceMs(), r);
      if (!why.has_value()) why = ReattachFailure(Now(), r);
      if (r->eval_failure.has_value()) {
        // A failed end-of-job evaluation is recovered once its cause is
        // known: a lost worker, or (a lease on) the evaluation's own error.
        if (why.has_value()) {
          why = absl::StrCat(*why, " during the end-of-job evaluation");
        } else if (Now() - r->eval_failed_ms >= FailureGraceMs()) {
          why = r->eval_failure;
        }
      }
      if (why.has_value()) {
        r->busy = true;
        // A paused job is recovered too, and stays paused.
        const bool restart = r->job.restarts() < MaxRestarts(r->job.spec());
        out.push_back({restart ? ActionKind::kRecover : ActionKind::kFail, id,
                       restart ? *why : GiveUpReason(r->job, *why)});
      } else if (r->eval_failure.has_value()) {
        // Waits for the cause; evaluating again would fail again.
      } else if (StagesDone(*r)) {
        r->busy = true;
        out.push_back({ActionKind::kFinish, id, ""});
      } else if (state == v1::JOB_STATE_RUNNING) {
        // Growth first: a job whose steps pass a checkpoint boundary at
        // every tick would otherwise always have a checkpoint in flight
        // when growth is judged, and never grow.
        if (std::optional<Action> a = GrowthDue(r)) {
          out.push_back(*a);
        } else if (std::optional<Action> c = CheckpointDue(r)) {
          out.push_back(*c);
        }
      }
    }
  }
  if (pending && !start_in_flight_) {
    start_in_flight_ = true;
    out.push_back({ActionKind::kStartPending, "", ""});
  }
  return out;
}

void SchedulerCore::RunAction(const Action& action) {
  switch (action.kind) {
    case ActionKind::kStartPending:
      return StartPendingJobs();
    case ActionKind::kFinish:
      return FinishJob(action.job_id);
    case ActionKind::kFail:
      return FailJob(action.job_id, action.why);
    case ActionKind::kReset:
      return ResetLaunch(action.job_id);
    case ActionKind::kRecover:
      return RecoverJob(action.job_id, action.why);
    case ActionKind::kRequestSnapshot:
      return RequestSnapshotAction(action.job_id);
    case ActionKind::kFetchCheckpoint:
      return FetchCheckpoint(action.job_id, action.step);
    case ActionKind::kGrow:
      return GrowJob(action.job_id);
  }
}

void SchedulerCore::StartPendingJobs() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = jobs_.ids();
  }
  for (const std::string& id : ids) {
    {
      absl::MutexLock lock(&mu_);
      JobRecord* r = *jobs_.Find(id);
      if (r->busy || r->job.state() != v1::JOB_STATE_PENDING) continue;
      r->busy = true;
    }
    StartJob(id);
  }
  absl::MutexLock lock(&mu_);
  start_in_flight_ = false;
}

void SchedulerCore::StartJob(const std::string& job_id) {
  v1::Job job;
  {
    absl::MutexLock lock(&mu_);
    job = (*jobs_.Find(job_id))->job;
  }
  std::vector<v1::WorkerInfo> idle =
      registry_.Idle(job.spec().worker_selector());
  if (static_cast<int>(idle.size()) < std::max(1, job.spec().num_stages())) {
    EndAction(job_id, std::nullopt);  // waits for workers
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    // Always legal: the job is PENDING and held busy.
    const absl::Status moved =
        jobs_.Transition(*jobs_.Find(job_id), v1::JOB_STATE_PLANNING, Now());
    if (!moved.ok()) PT_LOG(ERROR) << job_id << ": " << moved;
  }
  Flush();
  bool claimed = false;
  absl::StatusOr<v1::Plan> plan = PlanAndAssign(job, std::move(idle), &claimed);
  if (claimed) {
    PT_LOG(INFO) << job_id << " waits: " << plan.status().message();
    registry_.Release(job_id);
    EndAction(job_id, v1::JOB_STATE_PENDING);
    return;
  }
  if (!plan.ok()) {
    FailJob(job_id, absl::StrCat("could not plan: ", plan.status().ToString()));
    return;
  }
  Launch(job_id, job.spec(), *plan);
}

void SchedulerCore::Launch(const std::string& job_id, const v1::JobSpec& spec,
                           const v1::Plan& plan) {
  // Saved weights the spec asks for (initFrom), read before any stage is
  // configured: a source gone since the submit fails the job, naming it.
  std::optional<ResumePoint> init;
  StageStart start;
  if (!spec.training().init_from().empty()) {
    absl::StatusOr<ResumePoint> loaded = LoadInitFrom(spec);
    if (!loaded.ok()) {
      FailJob(job_id,
              absl::StrCat("could not start: ", loaded.status().ToString()));
      return;
    }
    init = *std::move(loaded);
    start.step = init->step;
    start.info = init->info;
    start.state = &init->state;
  }
  // The plan and the assignments are on disk before any stage is
  // configured: a scheduler restarted mid-launch finds the stages to stop.
  Flush();
  absl::StatusOr<int64_t> total = LaunchStages(
      control_, job_id, spec, plan, options_.stage_recv_timeout_seconds, start);
  if (!total.ok()) {
    FailJob(job_id,
            absl::StrCat("could not start: ", total.status().ToString()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    r->job.set_total_steps(*total);
    r->last_checkpoint_ms = Now();  // the checkpoint interval starts now
    if (init.has_value()) NoteInitialState(*init, r);
  }
  EndAction(job_id, v1::JOB_STATE_RUNNING);
}

std::string SchedulerCore::AwaitLinks(
    const std::vector<v1::WorkerInfo>& candidates, double wait_seconds) {
  std::vector<std::string> ids;
  for (const v1::WorkerInfo& w : candidates) ids.push_back(w.id());
  const int pairs = static_cast<int>(ids.size() * (ids.size() - 1));
  int missing = registry_.WantProbes(ids, Now());
  if (missing == 0) return "";
  const auto start = std::chrono::steady_clock::now();
  const auto waited = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  while (missing > 0 && waited() < wait_seconds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    missing = registry_.MissingLinks(ids, Now());
  }
  if (missing == 0) return "";
  return absl::StrFormat(
      "links: %d of %d not measured after waiting %.1f s for probes; they "
      "use the flags' defaults",
      missing, pairs, waited());
}

std::string SchedulerCore::ProfileOtherKinds(
    const std::string& job_id, const std::vector<v1::WorkerInfo>& workers,
    const v1::ProfileRequest& request,
    std::map<std::string, v1::ProfileResponse>* profiles) {
  std::string note;
  const std::vector<std::vector<int>> kinds = GroupWorkerKinds(workers);
  for (size_t k = 1; k < kinds.size(); ++k) {
    const v1::WorkerInfo& w = workers[kinds[k].front()];
    absl::StatusOr<v1::ProfileResponse> profile =
        control_->Profile(w.address(), request);
    if (profile.ok()) {
      (*profiles)[w.id()] = *std::move(profile);
      continue;
    }
    PT_LOG(WARNING) << job_id << ": profiling " << w.id() << " failed ("
                    << profile.status()
                    << "); its kind is planned at its GEMM speed";
    absl::StrAppend(&note, "\nprofiling ", w.id(), " failed (",
                    profile.status().ToString(),
                    "); its kind is planned at its GEMM speed");
  }
  return note;
}

absl::StatusOr<v1::Plan> SchedulerCore::PlanAndAssign(
    const v1::Job& job, std::vector<v1::WorkerInfo> idle, bool* claimed) {
  const auto start = std::chrono::steady_clock::now();
  // Profiling allocates the job's activations: refuse a job that cannot
  // fit before any worker is asked to.
  RETURN_IF_ERROR(CheckJobFitsWorkers(job.spec().training(), idle));
  const v1::ProfileRequest profile_request =
      ProfileRequestFor(job.spec(), /*repetitions=*/3);
  PlanInputs inputs;
  inputs.job_id = job.id();
  inputs.spec = job.spec();
  const std::string links_note = AwaitLinks(idle, options_.probe_wait_seconds);
  ASSIGN_OR_RETURN(inputs.profile,
                   control_->Profile(idle[0].address(), profile_request));
  const std::string kinds_note =
      ProfileOtherKinds(job.id(), idle, profile_request, &inputs.kind_profiles);
  // The candidates again, with the links measured meanwhile.
  for (v1::WorkerInfo& w : idle) {
    if (std::optional<v1::WorkerInfo> now = registry_.Get(w.id())) {
      *w.mutable_links() = now->links();
    }
  }
  inputs.workers = std::move(idle);
  inputs.topology = options_.topology;
  inputs.message_overhead_seconds = options_.message_overhead_seconds;
  inputs.bubble = [this, &job](int k) {
    return model_->TheoreticalBubble(job.spec(), k);
  };
  ASSIGN_OR_RETURN(v1::Plan plan, BuildPlan(inputs));
  if (!links_note.empty()) {
    plan.set_explanation(absl::StrCat(plan.explanation(), "\n", links_note));
  }
  plan.set_explanation(absl::StrCat(plan.explanation(), kinds_note));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  plan.set_planning_seconds(seconds);
  if (planning_seconds_ != nullptr) planning_seconds_->Observe(seconds);
  for (const v1::PlannedStage& s : plan.stages()) {
    const absl::Status assigned =
        registry_.Assign(s.worker_id(), job.id(), s.stage());
    if (!assigned.ok()) {
      *claimed = true;
      return assigned;
    }
  }
  PT_LOG(INFO) << job.id() << " plan:\n" << plan.explanation();
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job.id());
  jobs_.SetPlan(r, plan);
  AddJobEvent(&r->job, v1::JOB_EVENT_PLANNED, PlanSummary(plan), Now());
  jobs_.Save(*r);
  return plan;
}

void SchedulerCore::FinishJob(const std::string& job_id) {
  std::vector<std::string> addresses;
  int64_t max_samples = 0;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    addresses = r->Addresses();
    max_samples = r->job.spec().eval_samples();
  }
  TakeFinalCheckpoint(job_id);
  absl::StatusOr<v1::EvalResult> eval =
      EvaluateStages(control_, addresses, job_id, max_samples);
  if (!eval.ok()) {
    const std::string why = absl::StrCat("the end-of-job evaluation failed: ",
                                         eval.status().ToString());
    // Recovered like any loss, from the latest committed checkpoint (the
    // final one when it was committed: nothing is trained again); with
    // checkpoints on but none committed yet (a scheduler away while the
    // job ran to its end fetched none), from the job's start: every step
    // is trained again. With checkpoints off the job fails.
    if (const std::optional<std::string> cannot = WhyNoEvalRecovery(job_id)) {
      FailJob(job_id, absl::StrCat(why, "; it cannot be recovered: ", *cannot));
      return;
    }
    PT_LOG(WARNING) << job_id << ": " << why
                    << "; waits to recover from the latest checkpoint";
    {
      absl::MutexLock lock(&mu_);
      JobRecord* r = *jobs_.Find(job_id);
      r->eval_failure = why;
      r->eval_failed_ms = Now();
    }
    EndAction(job_id, std::nullopt);
    return;
  }
  registry_.Release(job_id);
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    if (eval->step() == 0) eval->set_step(r->job.step());
    RecordEvaluation(*eval, r);
    PT_LOG(INFO) << job_id << " evaluated: loss " << eval->loss()
                 << ", accuracy " << eval->accuracy() << " on "
                 << eval->samples() << " samples";
  }
  EndAction(job_id, v1::JOB_STATE_COMPLETED);
}

std::optional<std::string> SchedulerCore::WhyNoEvalRecovery(
    const std::string& job_id) {
  if (options_.checkpoints == nullptr) {
    return "this scheduler keeps no checkpoints (it has no data directory)";
  }
  bool off = false;
  {
    absl::MutexLock lock(&mu_);
    off = (*jobs_.Find(job_id))->job.spec().training().checkpoint_every() < 0;
  }
  if (off) {
    return "the job has no checkpoint (checkpoints are off: "
           "checkpointEvery is -1)";
  }
  absl::StatusOr<CheckpointInfo> latest = options_.checkpoints->Latest(job_id);
  if (latest.ok() || absl::IsNotFound(latest.status())) return std::nullopt;
  return absl::StrCat("its checkpoints could not be listed: ",
                      latest.status().ToString());
}

void SchedulerCore::FailJob(const std::string& job_id, const std::string& why) {
  PT_LOG(WARNING) << job_id << " failed: " << why;
  StopStages(control_, StageAddresses(job_id), job_id);
  registry_.Release(job_id);
  EndAction(job_id, v1::JOB_STATE_FAILED, why);
}

void SchedulerCore::ResetLaunch(const std::string& job_id) {
  PT_LOG(WARNING) << job_id
                  << " was being launched when the scheduler stopped; "
                     "stopping its stages and starting it again";
  StopStages(control_, StageAddresses(job_id), job_id);
  registry_.Release(job_id);
  {
    absl::MutexLock lock(&mu_);
    jobs_.ClearPlan(*jobs_.Find(job_id));
  }
  EndAction(job_id, v1::JOB_STATE_PENDING);
}

void SchedulerCore::EndAction(const std::string& job_id,
                              std::optional<v1::JobState> to,
                              const std::string& error) {
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    if (!error.empty()) r->job.set_error(error);
    if (to.has_value()) {
      const absl::Status moved = jobs_.Transition(r, *to, Now());
      if (!moved.ok()) PT_LOG(ERROR) << job_id << ": " << moved;
    } else if (!error.empty()) {
      jobs_.Save(*r);
    }
    r->busy = false;
  }
  Flush();
  // A new state may free workers or call for the next action now. (Not
  // after a start that keeps waiting: the loop would spin.)
  if (to.has_value()) wake_.SignalAll();
}

std::vector<std::string> SchedulerCore::StageAddresses(
    const std::string& job_id) {
  std::vector<std::string> out;
  {
    absl::MutexLock lock(&mu_);
    out = (*jobs_.Find(job_id))->Addresses();
  }
  for (const v1::WorkerInfo& w : registry_.AssignedTo(job_id)) {
    if (std::find(out.begin(), out.end(), w.address()) == out.end()) {
      out.push_back(w.address());
    }
  }
  return out;
}

}  // namespace pipetrain
