// A job's event log (Job.events): what happened to it, in the words a user
// reads in `pipetrainctl get`. Bounded: the oldest events beyond
// kMaxJobEvents are dropped (the first, "submitted", is kept).
//
// Pure functions over a v1::Job; the caller guards it.
#ifndef PIPETRAIN_SCHEDULER_JOB_EVENTS_H_
#define PIPETRAIN_SCHEDULER_JOB_EVENTS_H_

#include <cstdint>
#include <string>

#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {

inline constexpr int kMaxJobEvents = 1000;

struct JobEventFields {
  int64_t step = 0;
  int64_t version = 0;
  double seconds = 0;
};

// Appends an event at `now_ms`.
void AddJobEvent(v1::Job* job, v1::JobEventKind kind,
                 const std::string& message, int64_t now_ms,
                 const JobEventFields& fields = {});

// "3 stages: layers [0, 2) on worker-1, ...; predicted step 0.12 s".
std::string PlanSummary(const v1::Plan& plan);

// The event a move of the job to `to` means (RESUMED when a PAUSED job
// runs again, STARTED otherwise), or UNSPECIFIED for a move that is no
// event of its own (back to PENDING, PLANNING).
v1::JobEventKind EventForTransition(v1::JobState from, v1::JobState to);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_JOB_EVENTS_H_
