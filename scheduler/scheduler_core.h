// SchedulerCore: the scheduler's logic behind both the gRPC service and the
// REST gateway (services/ adapts every method; none is written twice).
//
// Jobs move PENDING -> PLANNING -> RUNNING <-> PAUSED -> COMPLETED | FAILED |
// CANCELLED. A control thread ticks every 100 ms: it expires leases, starts
// pending jobs when enough workers are idle (profiling the model on one of
// them, planning the partition, configuring and starting every stage),
// finishes jobs whose stages are done (evaluating the result) and fails
// jobs whose stages failed or whose workers were lost. Progress, the
// weight-version ledger and stage states arrive with worker heartbeats.
//
// Thread-safe. Every public method returns quickly except SubmitJob-free
// control calls that talk to workers (Pause, Resume, Cancel, Evaluate),
// which block on worker RPCs with deadlines.
#ifndef PIPETRAIN_SCHEDULER_SCHEDULER_CORE_H_
#define PIPETRAIN_SCHEDULER_SCHEDULER_CORE_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/interfaces.h"
#include "scheduler/planner.h"
#include "scheduler/state_store.h"
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
};

class SchedulerCore {
 public:
  // `control`, `model` and `metrics` are borrowed and must outlive the core
  // (metrics may be null). Loads persisted state and starts the control
  // thread.
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

  // Users.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> PauseJob(const v1::JobActionRequest& request);
  absl::StatusOr<v1::Job> ResumeJob(const v1::JobActionRequest& request);
  absl::StatusOr<v1::Job> CancelJob(const v1::JobActionRequest& request);
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& request);
  absl::StatusOr<v1::GetVersionsResponse> GetVersions(
      const v1::GetVersionsRequest& request);
  absl::StatusOr<v1::EvalResult> Evaluate(const v1::EvaluateRequest& request);
  // Every stage's recent trace, merged, also as Chrome trace JSON.
  absl::StatusOr<v1::GetJobTraceResponse> GetJobTrace(
      const v1::GetJobTraceRequest& request);

  // True once state is loaded and the control thread runs.
  bool ready() const { return ready_.load(); }

 private:
  struct JobEntry;
  SchedulerCore(const SchedulerOptions& options, StageControl* control,
                ModelSupport* model, MetricsRegistry* metrics);
  absl::Status Init();
  void Loop();
  void Tick();
  // Each runs without mu_ held while it talks to workers.
  void TryStart(const std::string& job_id);
  absl::StatusOr<v1::Plan> PlanJob(const v1::Job& job,
                                   const std::vector<v1::WorkerInfo>& workers);
  absl::Status LaunchStages(const std::string& job_id, const v1::Plan& plan);
  void Finish(const std::string& job_id);
  void FailJob(const std::string& job_id, const std::string& why);
  void StopStages(const std::vector<std::string>& addresses,
                  const std::string& job_id);
  void ApplyReport(const std::string& worker_id, const v1::StageReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetState(JobEntry* entry, v1::JobState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistJob(const v1::Job& job);
  // Writes the ledger entries and job progress that heartbeats queued.
  // Runs on the control thread: a disk sync never blocks a heartbeat (a
  // network reaction) or holds mu_.
  void FlushProgress();
  absl::StatusOr<JobEntry*> Find(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<v1::TensorProto>> FetchWeights(
      const std::vector<std::string>& addresses, const std::string& job_id);
  void RegisterMetrics();

  // Constant after construction.
  const SchedulerOptions options_;
  StageControl* const control_;     // borrowed
  ModelSupport* const model_;       // borrowed
  MetricsRegistry* const metrics_;  // borrowed, may be null
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  Histogram* planning_seconds_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  // Progress queued by heartbeats for FlushProgress.
  std::map<std::string, std::vector<v1::VersionEntry>> pending_versions_
      ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirty_jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<bool> ready_{false};
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_SCHEDULER_CORE_H_
