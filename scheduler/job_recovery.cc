// SchedulerCore's recovery of a running job whose worker was lost, whose
// stage failed or whose end-of-job evaluation failed: stop every stage, put
// spare workers in the lost ones' places (same partition) or re-plan on the
// workers left, then configure every stage from the latest committed
// checkpoint (or step 0 with the seeded initialization) and train on. A
// paused job is recovered the same way and stays paused (its stages
// restored, waiting for ResumeJob); a job restored at its last step (its
// final checkpoint) trains nothing and is evaluated again. The version
// ledger gets an explicit rollback; the job's event log says what happened.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_events.h"
#include "scheduler/plan_builder.h"
#include "scheduler/recovery_plan.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/stage_driver.h"

namespace pipetrain {
namespace {

std::vector<std::pair<std::string, int>> Assignments(const v1::Plan& plan) {
  std::vector<std::pair<std::string, int>> out;
  for (const v1::PlannedStage& s : plan.stages()) {
    out.emplace_back(s.worker_id(), s.stage());
  }
  return out;
}

}  // namespace

void SchedulerCore::RecoverJob(const std::string& job_id,
                               const std::string& why) {
  v1::Job job;
  v1::Plan old_plan;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    job = r->job;
    old_plan = *r->plan;
    // A retry of this recovery (no worker free yet, a restart that could
    // not launch: recover_why set while one is in progress) keeps the
    // first try's event and timing. A growth whose launch failed hands its
    // cause over in recover_why with no recovery in progress: logged.
    const bool retry =
        r->recover_why.has_value() && r->recovering_since_ms != 0;
    if (r->recovering_since_ms == 0) r->recovering_since_ms = Now();
    if (!retry) {
      AddJobEvent(&r->job, v1::JOB_EVENT_WORKER_LOST, why, Now(),
                  {r->job.step(), r->job.committed_version(), 0});
      jobs_.Save(*r);
    }
    r->recover_why.reset();
    // A failed end-of-job evaluation is answered by this recovery: the
    // stages are restored and the job is evaluated again once they are
    // done.
    r->eval_failure.reset();
    r->eval_failed_ms = 0;
  }
  PT_LOG(WARNING) << job_id << ": " << why << "; recovering";
  // A LOST worker is not called: on a real network its address may hang
  // until the deadline, and recovery time counts.
  std::vector<std::string> addresses = StageAddresses(job_id);
  for (const v1::WorkerInfo& w : registry_.List()) {
    if (w.state() != v1::WORKER_STATE_LOST) continue;
    addresses.erase(
        std::remove(addresses.begin(), addresses.end(), w.address()),
        addresses.end());
  }
  StopStages(control_, addresses, job_id);
  bool replanned = false;
  absl::StatusOr<v1::Plan> plan = RepairPlan(job, old_plan, &replanned);
  absl::StatusOr<ResumePoint> resume =
      plan.ok() ? LoadResumePoint(job) : plan.status();
  if (!resume.ok() && !absl::IsUnavailable(resume.status())) {
    FailJob(
        job_id,
        absl::StrCat(why, "; could not recover: ", resume.status().ToString()));
    return;
  }
  if (!resume.ok()) {
    // Nothing to resume on yet (no worker free, a spare just taken): wait
    // and try again; no restart is spent.
    PT_LOG(WARNING) << job_id << " waits to recover: " << resume.status();
    {
      absl::MutexLock lock(&mu_);
      (*jobs_.Find(job_id))->recover_why = why;
    }
    EndAction(job_id, std::nullopt);
    return;
  }
  InstallRecoveryPlan(job_id, *plan, *resume, replanned,
                      old_plan.stages_size());
  if (recoveries_ != nullptr) recoveries_->Increment();
  Flush();  // the plan and assignments are on disk before any stage moves
  StageStart start;
  start.step = resume->step;
  start.info = resume->info;
  start.attempt = job.attempt() + 1;  // InstallRecoveryPlan counted it
  // A paused job's stages wait, restored, for ResumeJob.
  start.train = job.state() != v1::JOB_STATE_PAUSED;
  if (!resume->state.empty()) start.state = &resume->state;
  int failed_stage = -1;
  absl::StatusOr<int64_t> total =
      LaunchStages(control_, job_id, job.spec(), *plan,
                   options_.stage_recv_timeout_seconds, start, &failed_stage);
  if (!total.ok()) {
    OweRecovery(job_id,
                absl::StrCat("could not restart: ", total.status().ToString()),
                total.status(), *plan, failed_stage);
  } else if (!start.train) {
    EndRestoredRecovery(job_id, "still paused");
  } else if (resume->step >= *total) {
    // Restored at the last step (the final checkpoint of a job whose
    // end-of-job evaluation failed): the stages are done at once and the
    // job is evaluated again.
    EndRestoredRecovery(job_id, "nothing left to train, evaluating again");
  }
  EndAction(job_id, std::nullopt);
}

void SchedulerCore::OweRecovery(const std::string& job_id,
                                const std::string& why,
                                const absl::Status& launch,
                                const v1::Plan& plan, int failed_stage) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job_id);
  r->recover_why = why;
  // An unreachable worker is often one that died a moment ago, its lease
  // not yet run out: the next try waits for the registry's verdict.
  if (absl::IsUnavailable(launch) && failed_stage >= 0 &&
      failed_stage < plan.stages_size()) {
    r->unreachable_worker = plan.stages(failed_stage).worker_id();
    r->unreachable_worker_ms = Now();
  }
}

// A paused job completes no step until it is resumed, and one restored at
// its last step completes none at all: the recovery ends once the stages
// hold the checkpoint again.
void SchedulerCore::EndRestoredRecovery(const std::string& job_id,
                                        const std::string& then) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job_id);
  const double seconds = (Now() - r->recovering_since_ms) / 1000.0;
  // The rollback's version: stages that already reported on the new
  // attempt may have moved committed_version.
  const int64_t version = r->job.rollbacks().empty()
                              ? r->job.committed_version()
                              : r->job.rollbacks().rbegin()->version();
  AddJobEvent(&r->job, v1::JOB_EVENT_RECOVERED,
              absl::StrCat("restored at step ", r->resume_step,
                           " from version ", version, "; ", then),
              Now(), {r->resume_step, version, seconds});
  if (recovery_seconds_ != nullptr) recovery_seconds_->Observe(seconds);
  r->resume_step = -1;
  r->recovering_since_ms = 0;
  jobs_.Save(*r);
}

void SchedulerCore::RollBackToPlan(JobRecord* r, const v1::Plan& plan,
                                   const ResumePoint& resume) {
  v1::Job& job = r->job;
  int64_t reached = job.step();
  for (const v1::StageProgress& p : job.stages()) {
    reached = std::max(reached, p.next_step());
  }
  v1::VersionRollback* rollback = job.add_rollbacks();
  rollback->set_from_step(reached);
  rollback->set_to_step(resume.step);
  rollback->set_version(resume.version);
  rollback->set_unix_ms(Now());
  jobs_.SetPlan(r, plan);
  job.set_attempt(job.attempt() + 1);
  job.clear_stages();
  job.set_step(resume.step);
  job.set_committed_version(resume.version);
  r->resume_step = resume.step;
  r->unreachable_since_ms = 0;
  r->snapshot_step = -1;
  r->last_checkpoint_step = resume.step;
  r->last_checkpoint_ms = Now();
}

void SchedulerCore::InstallRecoveryPlan(const std::string& job_id,
                                        const v1::Plan& plan,
                                        const ResumePoint& resume,
                                        bool replanned, int old_stages) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job_id);
  v1::Job& job = r->job;
  RollBackToPlan(r, plan, resume);
  job.set_restarts(job.restarts() + 1);
  if (replanned) {
    AddJobEvent(
        &job, v1::JOB_EVENT_REPLANNED,
        absl::StrCat("re-planned from ", old_stages, " to ", plan.stages_size(),
                     " stages: ", PlanSummary(plan)),
        Now(), {resume.step, resume.version, 0});
  }
  r->resuming_after_growth = false;
  PT_LOG(INFO) << job_id << " resumes at step " << resume.step << " from "
               << resume.source << " (restart " << job.restarts() << " of "
               << MaxRestarts(job.spec()) << ")";
  jobs_.Save(*r);
}

absl::StatusOr<v1::Plan> SchedulerCore::RepairPlan(const v1::Job& job,
                                                   const v1::Plan& old,
                                                   bool* replanned) {
  std::map<std::string, v1::WorkerInfo> workers;
  for (v1::WorkerInfo& w : registry_.List()) workers[w.id()] = std::move(w);
  const std::vector<int> lost = LostStages(old, workers, job.id());
  std::vector<v1::WorkerInfo> spares =
      registry_.Idle(job.spec().worker_selector());
  std::optional<v1::Plan> plan = WithSpares(old, lost, spares);
  if (!plan.has_value()) {
    // Too few spares: every worker the job still has, and every spare.
    for (int s = 0; s < old.stages_size(); ++s) {
      if (std::find(lost.begin(), lost.end(), s) != lost.end()) continue;
      spares.push_back(workers[old.stages(s).worker_id()]);
    }
    if (spares.empty()) {
      return absl::UnavailableError("no worker is left to run the job");
    }
    ASSIGN_OR_RETURN(plan, Replan(job, std::move(spares)));
    *replanned = true;
  }
  const absl::Status assigned =
      registry_.AssignJob(job.id(), Assignments(*plan));
  if (!assigned.ok()) return absl::UnavailableError(assigned.message());
  return *plan;
}

absl::StatusOr<v1::Plan> SchedulerCore::Replan(
    const v1::Job& job, std::vector<v1::WorkerInfo> workers) {
  const auto start = std::chrono::steady_clock::now();
  const v1::ProfileRequest profile_request =
      ProfileRequestFor(job.spec(), /*repetitions=*/3);
  PlanInputs inputs;
  inputs.job_id = job.id();
  inputs.spec = job.spec();
  // A fixed stage count the workers left cannot meet becomes what they can.
  if (inputs.spec.num_stages() > static_cast<int>(workers.size())) {
    inputs.spec.set_num_stages(static_cast<int>(workers.size()));
  }
  // A recovery does not wait for probes: links never measured (e.g. to a
  // spare that joined while the job ran) are asked for now, for later
  // plans, and this one says which it did not know.
  const std::string links_note = AwaitLinks(workers, 0);
  ASSIGN_OR_RETURN(inputs.profile,
                   control_->Profile(workers[0].address(), profile_request));
  const std::string kinds_note = ProfileOtherKinds(
      job.id(), workers, profile_request, &inputs.kind_profiles);
  inputs.workers = std::move(workers);
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
  plan.set_planning_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());
  return plan;
}

}  // namespace pipetrain
