// SchedulerCore: the scheduler behind both the gRPC service and the REST
// gateway (services/ adapts every method; none is written twice). A thin
// coordinator over small parts, each tested on its own:
//
//   JobTable (job_table.h)        jobs, plans and the state machine
//   StateWriter (state_writer.h)  persistence, written off the locks
//   WorkerRegistry                workers and their leases
//   BuildPlan (plan_builder.h)    profiles + workers -> plan
//   stage_driver.h                launch, pause, resume, stop, evaluate
//   ApplyStageReport (job_progress.h)  heartbeats -> progress, evaluations
//   ChromeTraceJson (trace_export.h)   traces -> Chrome trace JSON
//
// Jobs move PENDING -> PLANNING -> RUNNING <-> PAUSED -> COMPLETED | FAILED |
// CANCELLED. A control loop (Tick) writes queued state, expires leases and
// decides actions: start pending jobs when enough workers are idle
// (profile, plan, assign, configure and train every stage), finish jobs
// whose stages are done (evaluate through the pipeline: a failed
// evaluation is recovered from the latest checkpoint and evaluated again,
// or fails the job without one), recover or fail jobs with a failed stage
// or a lost worker, and reset a launch a previous scheduler process left half
// done (stop and free its workers, back to PENDING). Progress, the version
// ledger and periodic evaluations arrive with heartbeats.
//
// Locking: mu_ guards the job table and is held only for in-memory work.
// Network handlers (Heartbeat, RegisterWorker, Get*, List*) take it or the
// registry's lock briefly and never wait for a disk write or a worker call;
// SQLite writes happen in StateWriter::Flush, called with no lock held.
//
// Thread-safe. Pause, Resume, Cancel, Evaluate, GetJobTrace and
// GetVersions block on worker calls or disk; call them off network
// reactions.
#ifndef PIPETRAIN_SCHEDULER_SCHEDULER_CORE_H_
#define PIPETRAIN_SCHEDULER_SCHEDULER_CORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics_registry.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/action_runner.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/elastic_growth.h"
#include "scheduler/interfaces.h"
#include "scheduler/job_table.h"
#include "scheduler/planner.h"
#include "scheduler/state_store.h"
#include "scheduler/state_writer.h"
#include "scheduler/worker_registry.h"

namespace pipetrain {

struct SchedulerOptions {
  RegistryOptions registry;
  // Directory of the SQLite state; empty keeps state in memory only.
  std::string data_dir;
  // Link bandwidth between worker zones (label "zone").
  Topology topology;
  // Stage time per stream message the planner charges
  // (--message_overhead_seconds); negative: measured (MessageOverhead in
  // plan_builder.h).
  double message_overhead_seconds = -1.0;
  // Before a job's first plan, how long to wait for the links among its
  // candidate workers to be measured (asked for at once); then the plan
  // uses what is known and says so. 0: no wait (probes are still asked).
  double probe_wait_seconds = 0.0;
  double tick_seconds = 0.1;
  // Seconds a stage waits for a neighbour before failing the step.
  double stage_recv_timeout_seconds = 60.0;
  // Run Tick on a thread of the core's every tick_seconds. Tests turn it
  // off and call Tick themselves.
  bool control_thread = true;
  // Run each job action (start, finish, fail, reset) on its own thread, so
  // one job's evaluation never holds up another job. Off: Tick runs them
  // before it returns.
  bool action_threads = true;
  // Where committed checkpoints live (borrowed, must outlive the core);
  // null: the scheduler takes no checkpoints and recovers from step 0.
  CheckpointStore* checkpoints = nullptr;
  // Jobs with checkpoint_every 0 checkpoint this often (seconds of
  // training).
  double checkpoint_interval_seconds = 60;
  // Where TrainingSpec.init_from files may come from (a path in the spec is
  // taken relative to it, and must resolve inside it); empty: none may.
  std::string models_dir;
  // Wall-clock milliseconds since the Unix epoch (leases, timestamps);
  // unset means the system clock.
  std::function<int64_t()> now_ms;
};

class SchedulerCore {
 public:
  // `control`, `model` and `metrics` are borrowed and must outlive the core
  // (metrics may be null). Loads persisted state and starts the control
  // thread (when enabled).
  static absl::StatusOr<std::unique_ptr<SchedulerCore>> Create(
      const SchedulerOptions& options, StageControl* control,
      ModelSupport* model, MetricsRegistry* metrics);
  ~SchedulerCore();

  // Workers.
  // `admission` says who is calling (see WorkerRegistry::Register); the
  // defaults are for callers without a network edge (tests).
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request,
      const WorkerAdmission& admission = {});
  // PermissionDenied when the caller is not the worker that registered the
  // id (`identity` as in WorkerAdmission); register_again when the id is
  // unknown.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request, const std::string& identity = "");
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& request);
  // Forgets a worker that left for good (see WorkerRegistry::Remove).
  absl::StatusOr<v1::RemoveWorkerResponse> RemoveWorker(
      const v1::RemoveWorkerRequest& request);

  // Users. A submitted job is written to disk by the next tick.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request);
  // RUNNING -> PAUSED at a step boundary.
  absl::StatusOr<v1::Job> PauseJob(const v1::JobActionRequest& request);
  // PAUSED -> RUNNING.
  absl::StatusOr<v1::Job> ResumeJob(const v1::JobActionRequest& request);
  // Stops every stage and frees the workers; Unavailable while the job is
  // being started or stopped.
  absl::StatusOr<v1::Job> CancelJob(const v1::JobActionRequest& request);
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& request);
  absl::StatusOr<v1::GetVersionsResponse> GetVersions(
      const v1::GetVersionsRequest& request);
  // Evaluates a PAUSED or COMPLETED job through its stages (every stage is
  // called; the last one's result is returned and recorded as the job's
  // latest evaluation). FailedPrecondition for a job whose stages train
  // (pause it first) or hold nothing (not started, failed, cancelled).
  absl::StatusOr<v1::EvalResult> Evaluate(const v1::EvaluateRequest& request);
  // Checkpoints (job_checkpoints.cc). Committed ones, oldest first.
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request);
  // Asks every stage of a RUNNING job to snapshot just ahead of stage 0;
  // the checkpoint is written in the background once all passed that step.
  // FailedPrecondition without a checkpoint store or for a job not
  // running; Unavailable while one is being taken.
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointJob(
      const v1::CheckpointJobRequest& request);
  // The model export (one safetensors file: every layer's parameters, the
  // spec, step and version in its metadata) of committed checkpoint
  // request.version (0: the latest), in pieces to `sink`. NotFound for a
  // job or version that has none; FailedPrecondition without a store.
  absl::Status ExportModel(const v1::ExportModelRequest& request,
                           const ByteSink& sink);
  // Every stage's recent trace, merged, also as Chrome trace JSON.
  absl::StatusOr<v1::GetJobTraceResponse> GetJobTrace(
      const v1::GetJobTraceRequest& request);

  // One pass of the control loop (see the top of this file). The control
  // thread calls it; without one, tests do.
  void Tick();
  // Blocks until no action Tick started is running.
  void WaitForActions();

  // True once state is loaded and the control loop runs.
  bool ready() const { return ready_.load(); }

 private:
  enum class ActionKind {
    kStartPending,
    kFinish,
    kFail,
    kReset,
    kRecover,
    kRequestSnapshot,
    kFetchCheckpoint,
    kGrow
  };
  struct Action {
    ActionKind kind;
    std::string job_id;  // empty for kStartPending
    std::string why;     // kFail, kRecover
    int64_t step = 0;    // kFetchCheckpoint
  };
  // Where a recovered job resumes (job_recovery.cc).
  struct ResumePoint {
    int64_t step = 0;
    int64_t version = 0;
    // Empty without a checkpoint: the seeded initialization.
    std::vector<StateTensor> state;
    StageStateInfo info;
    // e.g. "checkpoint 3 at step 40", "the seeded initialization".
    std::string source;
  };

  SchedulerCore(const SchedulerOptions& options, StageControl* control,
                ModelSupport* model, MetricsRegistry* metrics,
                std::unique_ptr<StateStore> store);
  absl::Status Init();
  absl::Status RestoreJobs();
  void FollowRestoredJob(JobRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  int64_t Now() const;
  // How long a stage failure blamed on an unreachable neighbour waits for
  // that neighbour's lease to expire (one lease plus a tick).
  int64_t FailureGraceMs() const;
  // Writes what is queued; logs failures (the writer retries them).
  void Flush();
  void RegisterMetrics();
  // Scrape-time samples of the gauges (scheduler_metrics.cc).
  std::vector<GaugeSample> WorkerStateSamples();
  std::vector<GaugeSample> JobStateSamples();
  std::vector<GaugeSample> CommittedVersionSamples();
  std::vector<GaugeSample> EvalSamples(double (*value)(const v1::EvalResult&));

  // The control loop's decisions; marks the jobs busy.
  std::vector<Action> ChooseActions(
      const std::map<std::string, v1::WorkerInfo>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunAction(const Action& action);
  // Actions, in job_lifecycle.cc; each runs without mu_ while it talks to
  // workers and ends with the job not busy.
  // Tries every PENDING job in submission order, one at a time, so that
  // two launches never claim the same idle workers.
  void StartPendingJobs();
  void StartJob(const std::string& job_id);
  // Asks for the links among `candidates` that are missing or stale and
  // waits up to `wait_seconds` for them (off the core's lock; action
  // threads only). Empty when all are known, else a line for the plan's
  // explanation saying how many are not.
  std::string AwaitLinks(const std::vector<v1::WorkerInfo>& candidates,
                         double wait_seconds);
  // Profiles the job on the first worker of each kind among `workers`
  // but workers[0]'s (worker_kinds.h), one at a time (co-located workers
  // would slow each other's measurement), into `profiles` by worker id. A
  // kind whose profile fails is planned at its GEMM speed: the returned
  // text says so, a line per such kind, for the plan's explanation.
  std::string ProfileOtherKinds(
      const std::string& job_id, const std::vector<v1::WorkerInfo>& workers,
      const v1::ProfileRequest& request,
      std::map<std::string, v1::ProfileResponse>* profiles)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Profiles the model on the first idle worker and on one worker of each
  // other kind (ProfileOtherKinds), plans, and assigns the planned workers.
  // `claimed`: one of them was taken meanwhile (lost, or re-registered);
  // the job should wait and try again.
  absl::StatusOr<v1::Plan> PlanAndAssign(const v1::Job& job,
                                         std::vector<v1::WorkerInfo> idle,
                                         bool* claimed);
  // Configures and starts the planned stages; RUNNING, or FAILED.
  void Launch(const std::string& job_id, const v1::JobSpec& spec,
              const v1::Plan& plan);
  // Takes the final checkpoint and evaluates through the stages: COMPLETED.
  // A failed evaluation is recovered from the latest committed checkpoint
  // (record->eval_failure; the control loop recovers once the cause is
  // known) and evaluated again; with none committed yet, from the job's
  // start (every step trained again); with checkpoints off the job fails.
  void FinishJob(const std::string& job_id);
  // Why a job whose end-of-job evaluation failed cannot be recovered (no
  // checkpoint store, checkpoints off, the store unreadable), or nullopt.
  std::optional<std::string> WhyNoEvalRecovery(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FailJob(const std::string& job_id, const std::string& why);
  void ResetLaunch(const std::string& job_id);
  // Recovery (job_recovery.cc): stops the job's stages, puts spares in the
  // lost workers' places or re-plans on the workers left, and launches
  // every stage from the latest checkpoint (or step 0). A recovery that
  // cannot launch leaves record->recover_why set for the next tick.
  void RecoverJob(const std::string& job_id, const std::string& why);
  // Ends a recovery whose stages hold the checkpoint but train no step (a
  // paused job, or one restored at its last step): the RECOVERED event
  // ("restored at step S from version V; `then`").
  void EndRestoredRecovery(const std::string& job_id, const std::string& then);
  // A relaunch (of a recovery or a growth) failed with `launch` at
  // `failed_stage` of `plan`: a recovery is owed for `why`; an unreachable
  // stage's worker is remembered so that the next try waits for the
  // registry to settle it.
  void OweRecovery(const std::string& job_id, const std::string& why,
                   const absl::Status& launch, const v1::Plan& plan,
                   int failed_stage) ABSL_LOCKS_EXCLUDED(mu_);
  // The plan to resume on; sets *replanned when the stage count or cut
  // changed. Unavailable when no worker can take the job now.
  absl::StatusOr<v1::Plan> RepairPlan(const v1::Job& job, const v1::Plan& old,
                                      bool* replanned);
  absl::StatusOr<v1::Plan> Replan(const v1::Job& job,
                                  std::vector<v1::WorkerInfo> workers);
  absl::StatusOr<ResumePoint> LoadResumePoint(const v1::Job& job);
  // The state a job's init_from names (job_init_from.cc): an export's
  // parameters at step 0, or a checkpoint's whole state at its step. Errors
  // name the init_from value and what is wrong with it.
  absl::StatusOr<ResumePoint> LoadInitFrom(const v1::JobSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A job launched from `init`: its progress starts at that step, and a
  // "latest checkpoint" source is pinned to the version loaded, so that a
  // recovery before the job's own first checkpoint reloads the same state.
  void NoteInitialState(const ResumePoint& init, JobRecord* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the weights after a finished job's last step as a checkpoint
  // (unless checkpoints are off or one is there), so that an export
  // without a version is the trained model. Logs what it could not do.
  void TakeFinalCheckpoint(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Checkpoint coordination (job_checkpoints.cc). The checkpoint action a
  // running job is due, if any (they do not make the job busy: training
  // goes on); marks it in flight.
  std::optional<Action> CheckpointDue(JobRecord* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Snapshot on every stage at a step just ahead of stage 0 (higher on
  // FailedPrecondition); returns the step.
  absl::StatusOr<int64_t> RequestSnapshots(const std::string& job_id);
  void RequestSnapshotAction(const std::string& job_id);
  // Fetches every stage's snapshot of `step`, writes it layer by layer and
  // commits it.
  void FetchCheckpoint(const std::string& job_id, int64_t step);
  absl::StatusOr<v1::CheckpointInfo> WriteCheckpoint(const std::string& job_id,
                                                     const v1::Plan& plan,
                                                     const v1::JobSpec& spec,
                                                     int64_t step);
  // Elastic growth (job_growth.cc). The growth action a running job is
  // due (idle workers seen and a checkpoint committed since), if any; marks
  // the job busy.
  std::optional<Action> GrowthDue(JobRecord* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Profiles on joining[0] and asks the planner (elastic_growth.h).
  absl::StatusOr<GrowthProposal> ProposeGrowthFor(
      const v1::Job& job, const v1::Plan& plan,
      const std::vector<v1::WorkerInfo>& joining);
  // Takes the idle workers in when the predicted gain is large enough:
  // stops the stages and launches the new plan from the latest checkpoint.
  void GrowJob(const std::string& job_id);
  void InstallGrowthPlan(const std::string& job_id,
                         const GrowthProposal& proposal,
                         const ResumePoint& resume, int old_stages);
  // What a recovery and a growth both record before the stages are
  // configured again: the rollback to `resume` in the version ledger, the
  // new plan and attempt, and progress reset to the resume step.
  void RollBackToPlan(JobRecord* r, const v1::Plan& plan,
                      const ResumePoint& resume)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the plan, the rollback and the resume step in the job's record.
  void InstallRecoveryPlan(const std::string& job_id, const v1::Plan& plan,
                           const ResumePoint& resume, bool replanned,
                           int old_stages);
  // Ends an action: moves the job to `to` when given (an illegal edge is
  // logged and skipped), sets the error when given, clears busy, then
  // writes the state.
  void EndAction(const std::string& job_id, std::optional<v1::JobState> to,
                 const std::string& error = "");
  // Where a job's stages may run: its plan's workers and any worker the
  // registry has assigned to it (a launch interrupted before it stored
  // the plan).
  std::vector<std::string> StageAddresses(const std::string& job_id);

  // Marks a job busy for a user action when it is in one of `states`;
  // FailedPrecondition saying what the action needs otherwise. Returns a
  // copy of the record.
  absl::StatusOr<JobRecord> BeginUserAction(
      const std::string& job_id, std::initializer_list<v1::JobState> states,
      const char* needs);

  // Constant after construction.
  const SchedulerOptions options_;
  // HeartbeatResponse.scheduler_instance: random for each process.
  const std::string instance_;
  StageControl* const control_;              // borrowed
  ModelSupport* const model_;                // borrowed
  MetricsRegistry* const metrics_;           // borrowed, may be null
  const std::unique_ptr<StateStore> store_;  // null: state in memory only
  StateWriter writer_;
  WorkerRegistry registry_;
  Histogram* planning_seconds_ = nullptr;    // set by Init
  Counter* recoveries_ = nullptr;            // set by Init
  Histogram* recovery_seconds_ = nullptr;    // set by Init
  Counter* checkpoints_written_ = nullptr;   // set by Init
  Counter* checkpoint_bytes_ = nullptr;      // set by Init
  Histogram* checkpoint_seconds_ = nullptr;  // set by Init

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // wakes the control loop early
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  // A StartPendingJobs action runs.
  bool start_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<bool> ready_{false};
  // Declared last: destroyed (joined) first, while the rest still exists.
  ActionRunner actions_;
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_SCHEDULER_CORE_H_
