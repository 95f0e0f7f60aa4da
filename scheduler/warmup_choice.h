// The extra warm-up of a cross-step schedule (JobSpec.extra_warmup, see
// spec/schedule.h): the stage count a fixed one allows, and the planner's
// choice when the spec asks for auto (-1). Used by BuildPlan
// (plan_builder.h). Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_WARMUP_CHOICE_H_
#define PIPETRAIN_SCHEDULER_WARMUP_CHOICE_H_

#include <string>

#include "scheduler/planner.h"

namespace pipetrain {

// The most stages extra warm-up e allows with M micro-batches a step:
// stage 0's (K - 1)(1 + e) warm-up forwards must fit in the step, so
// M / (1 + e) + 1.
int MaxStagesForExtraWarmup(int micro_batches, int extra_warmup);

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
