// How a job's progress is read from its stages' heartbeat reports, and what
// the control loop concludes from it: the ledger entries, step, committed
// version, loss, throughput and periodic evaluations a report brings, and
// whether the job is done or has failed.
//
// Pure functions over a JobRecord; the caller guards the record.
#ifndef PIPETRAIN_SCHEDULER_JOB_PROGRESS_H_
#define PIPETRAIN_SCHEDULER_JOB_PROGRESS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/job_table.h"

namespace pipetrain {

struct ReportEffects {
  // False when the report was ignored (unknown stage, another worker's
  // stage, no plan, or the job ended): nothing changed.
  bool applied = false;
  // (stage, step, weight version) of every step result, for the ledger.
  std::vector<v1::VersionEntry> ledger;
  // Periodic evaluations added to Job.evaluations.
  int new_evaluations = 0;
  // A recovery ended with this report (the last stage completed a step at
  // or after the resume step): seconds from the loss; -1 otherwise.
  double recovery_seconds = -1;
};

// Applies `report`, sent by worker `worker_id`, to the job in `record`.
// Ends a running recovery (record->resume_step) with a RECOVERED event.
// A report of another configuration than the job's current one
// (report.attempt != job.attempt: it was sent before a recovery and
// arrived after it) is ignored: it must not move progress or the ledger.
ReportEffects ApplyStageReport(const std::string& worker_id,
                               const v1::StageReport& report, int64_t now_ms,
                               JobRecord* record);

// Appends an evaluation (periodic, on request or final) to Job.evaluations
// and makes it Job.eval, the latest.
void RecordEvaluation(const v1::EvalResult& eval, JobRecord* record);

// Why a RUNNING or PAUSED job has failed (a planned worker lost or taken by
// another job, a stage reporting FAILED), or nullopt. `workers` by id.
//
// A stage that fails because a neighbour stopped answering (UNAVAILABLE)
// usually reports before the dead worker's lease runs out. Such a failure
// is held back for `grace_ms` after it is first seen (recorded in
// record->unreachable_since_ms), so that the reason can name the lost
// worker; after that it is reported as the stage's own error.
std::optional<std::string> JobFailure(
    const std::map<std::string, v1::WorkerInfo>& workers, int64_t now_ms,
    int64_t grace_ms, JobRecord* record);

// After a scheduler restart (record->reattach_by_ms set): clears it once
// every stage has reported on the job's current configuration in a state
// its job state expects (RUNNING or DONE; CONFIGURED too while PAUSED);
// past the deadline, why the stages could not be re-attached (then the job
// is recovered from its last checkpoint like one with a lost worker).
std::optional<std::string> ReattachFailure(int64_t now_ms, JobRecord* record);

// True when every stage of a RUNNING job reported DONE at the last step.
bool StagesDone(const JobRecord& record);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_JOB_PROGRESS_H_
