// SchedulerCore's elastic growth: a running job takes in workers that
// became idle since it was planned, at the next committed checkpoint, when
// the planner predicts a step time at least kMinGrowthGain lower
// (elastic_growth.h). The job is re-configured from that checkpoint under
// the new plan, as a re-planned recovery is but without a loss: no restart
// is spent, the ledger records the rollback to the checkpoint, and the
// event log says "grew from K to K' stages".
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/elastic_growth.h"
#include "scheduler/job_events.h"
#include "scheduler/plan_builder.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/stage_driver.h"

namespace pipetrain {
namespace {

std::string IdsOf(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::string> ids;
  for (const v1::WorkerInfo& w : workers) ids.push_back(w.id());
  return absl::StrJoin(ids, ",");
}

std::vector<std::pair<std::string, int>> PlanAssignments(const v1::Plan& p) {
  std::vector<std::pair<std::string, int>> out;
  for (const v1::PlannedStage& s : p.stages()) {
    out.emplace_back(s.worker_id(), s.stage());
  }
  return out;
}

std::vector<std::string> AddressesOf(const v1::Plan& plan) {
  std::vector<std::string> out;
  for (const v1::PlannedStage& s : plan.stages()) {
    out.push_back(s.worker_address());
  }
  return out;
}

}  // namespace

// Idle workers are first noted against the checkpoint the job has then
// (even while one is being fetched); the job is judged at the first tick
// with no checkpoint in flight after the next one is committed (so the
// steps redone after the re-configuration are only those since that
// checkpoint), and judged again only when the idle workers change. A
// job waiting to start has the first claim on idle workers: no job grows
// meanwhile.
std::optional<SchedulerCore::Action> SchedulerCore::GrowthDue(JobRecord* r) {
  if (options_.checkpoints == nullptr || r->resume_step >= 0 ||
      !r->plan.has_value()) {
    return std::nullopt;
  }
  for (const std::string& id : jobs_.ids()) {
    if ((*jobs_.Find(id))->job.state() == v1::JOB_STATE_PENDING) {
      return std::nullopt;
    }
  }
  const std::vector<v1::WorkerInfo> idle =
      registry_.Idle(r->job.spec().worker_selector());
  if (idle.empty()) {
    r->growth_after_step = -1;
    return std::nullopt;
  }
  if (IdsOf(idle) == r->growth_declined_for) return std::nullopt;
  if (r->growth_after_step < 0) {
    r->growth_after_step = r->last_checkpoint_step;
    return std::nullopt;
  }
  if (r->last_checkpoint_step <= r->growth_after_step) return std::nullopt;
  // A checkpoint being fetched would be cut off by the stop: wait for it.
  if (r->checkpoint_in_flight || r->snapshot_step == -2) return std::nullopt;
  r->growth_after_step = r->last_checkpoint_step;
  r->busy = true;
  return Action{ActionKind::kGrow, r->job.id(), "", 0};
}

absl::StatusOr<GrowthProposal> SchedulerCore::ProposeGrowthFor(
    const v1::Job& job, const v1::Plan& plan,
    const std::vector<v1::WorkerInfo>& joining) {
  std::map<std::string, v1::WorkerInfo> workers;
  for (v1::WorkerInfo& w : registry_.List()) workers[w.id()] = std::move(w);
  GrowthInputs in;
  in.job_id = job.id();
  in.spec = job.spec();
  in.current_stages = plan.stages_size();
  for (const v1::PlannedStage& s : plan.stages()) {
    auto w = workers.find(s.worker_id());
    if (w == workers.end()) {
      return absl::UnavailableError(
          absl::StrCat("worker ", s.worker_id(), " is gone"));
    }
    in.current.push_back(w->second);
  }
  in.joining = joining;
  v1::ProfileRequest profile_request =
      ProfileRequestFor(job.spec(), /*repetitions=*/9);
  // The joining worker is idle, but the job's own are busy training, on
  // the same machine when they share one: the fastest of nine runs per
  // layer is its cost without them (a median still moved the layers'
  // relative costs, and the predicted gain, by a third on a loaded host).
  profile_request.set_fastest(true);
  ASSIGN_OR_RETURN(in.profile,
                   control_->Profile(joining[0].address(), profile_request));
  // The other kinds among the joining workers (idle, so they can be
  // asked); a kind only the job's own workers have keeps its GEMM speed.
  ProfileOtherKinds(job.id(), joining, profile_request, &in.kind_profiles);
  in.topology = options_.topology;
  in.message_overhead_seconds = options_.message_overhead_seconds;
  in.bubble = [this, &job](int k) {
    return model_->TheoreticalBubble(job.spec(), k);
  };
  return ProposeGrowth(in);
}

void SchedulerCore::GrowJob(const std::string& job_id) {
  v1::Job job;
  v1::Plan old;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    job = r->job;
    old = *r->plan;
  }
  const std::vector<v1::WorkerInfo> joining =
      registry_.Idle(job.spec().worker_selector());
  absl::StatusOr<GrowthProposal> proposal =
      joining.empty() ? absl::UnavailableError("no idle worker")
                      : ProposeGrowthFor(job, old, joining);
  absl::StatusOr<ResumePoint> resume = proposal.ok() && proposal->worthwhile
                                           ? LoadResumePoint(job)
                                           : absl::CancelledError("");
  if (proposal.ok() && !proposal->worthwhile) {
    const std::string why = absl::StrFormat(
        "stays on %d stages: taking in %s predicts %.4g s a step against "
        "%.4g s (a growth needs %.0f%% less)",
        old.stages_size(), IdsOf(joining), proposal->proposed_seconds,
        proposal->current_seconds, 100 * kMinGrowthGain);
    PT_LOG(INFO) << job_id << " " << why;
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    AddJobEvent(&r->job, v1::JOB_EVENT_GROWTH_DECLINED, why, Now(),
                {r->job.step(), r->job.committed_version(), 0});
    jobs_.Save(*r);
  } else if (!proposal.ok() || !resume.ok()) {
    PT_LOG(WARNING) << job_id << " cannot grow: "
                    << (proposal.ok() ? resume.status() : proposal.status());
  }
  // The joining workers are claimed with the job's in one step; when one
  // was taken meanwhile nothing has changed and the job trains on.
  const absl::Status assigned =
      resume.ok() ? registry_.AssignJob(job_id, PlanAssignments(proposal->plan))
                  : resume.status();
  if (!assigned.ok()) {
    absl::MutexLock lock(&mu_);
    (*jobs_.Find(job_id))->growth_declined_for = IdsOf(joining);
  }
  if (!assigned.ok()) return EndAction(job_id, std::nullopt);
  StopStages(control_, AddressesOf(old), job_id);
  InstallGrowthPlan(job_id, *proposal, *resume, old.stages_size());
  Flush();  // the plan and assignments are on disk before any stage moves
  StageStart start;
  start.step = resume->step;
  start.info = resume->info;
  start.attempt = job.attempt() + 1;  // InstallGrowthPlan counted it
  if (!resume->state.empty()) start.state = &resume->state;
  int failed_stage = -1;
  absl::StatusOr<int64_t> total =
      LaunchStages(control_, job_id, job.spec(), proposal->plan,
                   options_.stage_recv_timeout_seconds, start, &failed_stage);
  if (!total.ok()) {
    // The recovery path takes over (spares, re-plan, or giving up).
    OweRecovery(job_id,
                absl::StrCat("could not restart after growing: ",
                             total.status().ToString()),
                total.status(), proposal->plan, failed_stage);
  }
  EndAction(job_id, std::nullopt);
}

void SchedulerCore::InstallGrowthPlan(const std::string& job_id,
                                      const GrowthProposal& proposal,
                                      const ResumePoint& resume,
                                      int old_stages) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job_id);
  v1::Job& job = r->job;
  RollBackToPlan(r, proposal.plan, resume);
  AddJobEvent(&job, v1::JOB_EVENT_REPLANNED,
              GrowthMessage(proposal, old_stages), Now(),
              {resume.step, resume.version, 0});
  r->resuming_after_growth = true;
  r->growth_after_step = -1;
  r->growth_declined_for.clear();
  PT_LOG(INFO) << job_id << " " << GrowthMessage(proposal, old_stages)
               << "; resumes at step " << resume.step << " from "
               << resume.source;
  jobs_.Save(*r);
}

}  // namespace pipetrain
