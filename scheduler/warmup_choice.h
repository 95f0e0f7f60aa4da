// The planner's choice of a cross-step schedule's extra warm-up when the
// job spec asks for auto (JobSpec.extra_warmup -1; the rule it must keep
// is in spec/schedule.h). Used by BuildPlan
// (plan_builder.h). Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_WARMUP_CHOICE_H_
#define PIPETRAIN_SCHEDULER_WARMUP_CHOICE_H_

#include <string>

#include "scheduler/planner.h"

namespace pipetrain {

// JobSpec.extra_warmup -1 on a cross-step schedule: enough micro-batches
// in flight per link to cover the slowest link's round trip at the
// bottleneck's pace, ceil(trip / bottleneck per micro-batch) + 1, within one
// step (stage 0's (K - 1)(1 + e) warm-up <= M) and, trying smaller ones,
// the workers' memory. Re-plans `planned` on the same stage count with
// it (`search`: the request the stage count was searched with, extra
// warm-up 0), sets request->extra_warmup, and returns the plan's line
// about it.
std::string ChooseExtraWarmup(const PlanRequest& search, PlanRequest* request,
                              PipelinePlan* planned);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_WARMUP_CHOICE_H_
