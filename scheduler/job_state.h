// The job state machine, in one place:
//
//   PENDING -> PLANNING -> RUNNING <-> PAUSED -> COMPLETED | FAILED | CANCELLED
//
// plus the edges that leave a state early: a pending or planning job can be
// cancelled, planning can fail, and a running or paused job can fail or be
// cancelled. PLANNING -> PENDING returns a job whose launch was interrupted
// (its workers were lost to another claim, or the scheduler restarted while
// launching) to the queue. COMPLETED, FAILED and CANCELLED are final.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_JOB_STATE_H_
#define PIPETRAIN_SCHEDULER_JOB_STATE_H_

#include "absl/status/status.h"
#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {

// COMPLETED, FAILED or CANCELLED.
bool IsTerminalJobState(v1::JobState state);

// True when the machine has an edge from `from` to `to`.
bool IsLegalJobTransition(v1::JobState from, v1::JobState to);

// OK for a legal edge; FailedPrecondition naming both states otherwise.
absl::Status CheckJobTransition(v1::JobState from, v1::JobState to);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_JOB_STATE_H_
