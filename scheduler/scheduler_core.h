// SchedulerCore: the scheduler behind both the gRPC service and the REST
// gateway (services/ adapts every method; none is written twice). A thin
// coordinator over small parts, each tested on its own:
//
//   JobTable (job_table.h)        jobs, plans and the state machine
//   StateWriter (state_writer.h)  persistence, written off the locks
//   WorkerRegistry                workers and their leases
//   BuildPlan (plan_builder.h)    profile + workers -> plan
//   stage_driver.h                launch, pause, resume, stop, evaluate
//   ApplyStageReport (job_progress.h)  heartbeats -> progress, evaluations
//   ChromeTraceJson (trace_export.h)   traces -> Chrome trace JSON
//
// Jobs move PENDING -> PLANNING -> RUNNING <-> PAUSED -> COMPLETED | FAILED |
// CANCELLED. A control loop (Tick) writes queued state, expires leases and
// decides actions: start pending jobs when enough workers are idle
// (profile, plan, assign, configure and train every stage), finish jobs
// whose stages are done (evaluate through the pipeline: a failed
// evaluation fails the job), fail jobs with a failed stage or a lost
// worker, and reset a launch a previous scheduler process left half done
// (stop and free its workers, back to PENDING). Progress, the version
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
#include "common/metrics.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/action_runner.h"
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
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& request);

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
  enum class ActionKind { kStartPending, kFinish, kFail, kReset };
  struct Action {
    ActionKind kind;
    std::string job_id;  // empty for kStartPending
    std::string why;     // kFail
  };

  SchedulerCore(const SchedulerOptions& options, StageControl* control,
                ModelSupport* model, MetricsRegistry* metrics,
                std::unique_ptr<StateStore> store);
  absl::Status Init();
  absl::Status RestoreJobs();
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
  // Profiles the model on the first idle worker, plans, and assigns the
  // planned workers. `claimed`: one of them was taken meanwhile (lost, or
  // re-registered); the job should wait and try again.
  absl::StatusOr<v1::Plan> PlanAndAssign(const v1::Job& job,
                                         std::vector<v1::WorkerInfo> idle,
                                         bool* claimed);
  // Configures and starts the planned stages; RUNNING, or FAILED.
  void Launch(const std::string& job_id, const v1::JobSpec& spec,
              const v1::Plan& plan);
  void FinishJob(const std::string& job_id);
  void FailJob(const std::string& job_id, const std::string& why);
  void ResetLaunch(const std::string& job_id);
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
  StageControl* const control_;              // borrowed
  ModelSupport* const model_;                // borrowed
  MetricsRegistry* const metrics_;           // borrowed, may be null
  const std::unique_ptr<StateStore> store_;  // null: state in memory only
  StateWriter writer_;
  WorkerRegistry registry_;
  Histogram* planning_seconds_ = nullptr;  // set by Init

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
