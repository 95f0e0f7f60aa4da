// JobTable: the jobs the scheduler knows, their plans and latest stage
// reports, moved only along the job state machine (scheduler/job_state.h)
// and queued for persistence on every change.
//
// Not thread-safe: SchedulerCore owns it and guards it with its mutex.
// Persistence is only queued here (StateWriter); nothing in this class does
// I/O, so it is cheap to use under that lock.
#ifndef PIPETRAIN_SCHEDULER_JOB_TABLE_H_
#define PIPETRAIN_SCHEDULER_JOB_TABLE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/state_writer.h"

namespace pipetrain {

// One job as the scheduler tracks it.
struct JobRecord {
  v1::Job job;
  // Set once planned; cleared when an interrupted launch is reset.
  std::optional<v1::Plan> plan;
  // Latest report per planned stage, step results stripped.
  std::vector<v1::StageReport> reports;
  // Per stage: the configuration (StageReport.attempt) and the step after
  // the last result taken from its reports. A worker repeats its results
  // until the scheduler has written them down (HeartbeatResponse), and a
  // repeated result is taken once. Sized by ApplyStageReport.
  struct ResultsTaken {
    int64_t attempt = -1;
    int64_t next_step = 0;
  };
  std::vector<ResultsTaken> results_taken;
  // The last stage's recent step times, newest last (throughput).
  std::deque<double> recent_step_seconds;
  // Highest step of a periodic evaluation taken from a report, so that a
  // report repeated by a retried heartbeat adds nothing.
  int64_t last_reported_eval_step = -1;
  // When a stage was first seen failed for an unreachable neighbour (0:
  // never); see JobFailure.
  int64_t unreachable_since_ms = 0;
  // Recovery (job_recovery.cc): a recovery is owed for this reason (set
  // when the failure was seen, or when a recovery could not relaunch).
  std::optional<std::string> recover_why;
  // A relaunch could not reach this worker at this time (empty: none):
  // the owed recovery waits until the registry has settled it (see
  // UnreachableWorkerSettled), so that a worker killed a moment before,
  // whose lease has not run out, does not spend a restart per tick.
  std::string unreachable_worker;
  int64_t unreachable_worker_ms = 0;
  // When the loss that the running recovery answers was seen, and the step
  // the stages resumed at; the first step completed at or after it ends
  // the recovery (0 / -1: none running).
  int64_t recovering_since_ms = 0;
  int64_t resume_step = -1;
  // A job restored by a restarted scheduler must hear from every stage of
  // its current configuration by then (0: not waiting); see
  // ReattachFailure.
  int64_t reattach_by_ms = 0;
  // The end-of-job evaluation failed (job_lifecycle.cc) with this reason,
  // at eval_failed_ms, and the job waits to be recovered from its latest
  // checkpoint: once a worker is seen lost (JobFailure names it) or, a
  // lease later, for the evaluation's own error. Not finished again
  // meanwhile.
  std::optional<std::string> eval_failure;
  int64_t eval_failed_ms = 0;
  // Checkpoints (job_checkpoints.cc): the boundary the stages were asked to
  // snapshot at (-1: none; -2: being asked), a fetch running, the last
  // committed checkpoint's step and when the job last checkpointed (or
  // started), and a checkpoint asked for by a user.
  int64_t snapshot_step = -1;
  bool checkpoint_in_flight = false;
  int64_t last_checkpoint_step = 0;
  int64_t last_checkpoint_ms = 0;
  // Elastic growth (job_growth.cc): the committed checkpoint's step when
  // idle workers were first seen (-1: none idle), the job being judged at
  // the next one; the idle workers last judged not worth taking in (not
  // judged again until they change); the job resumes after a growth, not a
  // recovery (no recovery time is recorded).
  int64_t growth_after_step = -1;
  std::string growth_declined_for;
  bool resuming_after_growth = false;
  // An action (start, finish, fail, reset, pause, resume, cancel, evaluate)
  // drives the job's stages off the lock; no other action may begin.
  bool busy = false;

  // The planned stages' worker addresses, stage order; empty without a plan.
  std::vector<std::string> Addresses() const;
};

class JobTable {
 public:
  // `writer` is borrowed and may be null (nothing persisted).
  explicit JobTable(StateWriter* writer);

  // Rebuilds the table from what a previous scheduler persisted. Jobs keep
  // their state (a PLANNING one is reset by the scheduler, which must stop
  // the stages it may have configured); a PENDING job's stored plan is
  // stale and dropped. New ids continue after the highest loaded one.
  void Restore(std::vector<v1::Job> jobs,
               std::map<std::string, v1::Plan> plans);

  // A new PENDING job ("job-N"), queued for persistence.
  JobRecord* Add(const v1::JobSpec& spec, int64_t now_ms);
  // NotFound naming the id.
  absl::StatusOr<JobRecord*> Find(const std::string& id);
  // Ids in submission order.
  const std::vector<std::string>& ids() const { return order_; }
  size_t size() const { return order_.size(); }

  // Moves `record` to `to` when the state machine allows it, appends the
  // event the move means (job_events.h; a failure's carries job.error(),
  // so set it first) and queues it; FailedPrecondition naming both states
  // otherwise, with nothing changed.
  absl::Status Transition(JobRecord* record, v1::JobState to, int64_t now_ms);
  // Sets the plan (one empty report per stage) and queues it.
  void SetPlan(JobRecord* record, v1::Plan plan);
  // Forgets the plan and the stage reports (the stored plan stays until a
  // new one replaces it; Restore ignores it while the job is PENDING).
  void ClearPlan(JobRecord* record);
  // Queues the job's current record (after progress or an evaluation).
  void Save(const JobRecord& record);

 private:
  StateWriter* const writer_;  // borrowed, may be null
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_;
  std::vector<std::string> order_;
  int64_t next_id_ = 1;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_JOB_TABLE_H_
