// The step time a placement predicts: the job's schedule simulated over
// the placement's stage and link costs (spec/simulator.cc), and the
// optimizer updates a step puts on the slowest worker's critical path, for
// the schedules the step is not simulated for. Used by BuildPlan
// (plan_builder.h). Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_STEP_PREDICTION_H_
#define PIPETRAIN_SCHEDULER_STEP_PREDICTION_H_

#include <vector>

#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/planner.h"

namespace pipetrain {

// The slowest worker's optimizer updates in one step: a stage updates its
// parameters as often as its instruction stream says (once a step, or once
// per micro-batch under asynchronous 1F1B), each update on its critical
// path; a worker with several chunks (interleaved) updates them all.
double OptimizerSecondsPerStep(const v1::JobSpec& spec,
                               const PlanRequest& request,
                               const std::vector<StageAssignment>& stages,
                               int chunks_per_worker);

// The step time of the placement simulated under the job's schedule, or -1
// for the schedules not simulated here (interleaved). Cross-step
// schedules: the steady step of a long run (with request.extra_warmup),
// past its first warm-up.
// Stage s: forward and backward compute on its worker plus the overhead of
// the messages each pass receives and sends, and its optimizer update; its
// activation link to s + 1 and gradient link to s - 1 carry one message per
// micro-batch each, occupying the link bytes / bandwidth and arriving a
// latency later.
double SimulatedStep(const v1::JobSpec& spec, const PlanRequest& request,
                     const std::vector<StageAssignment>& stages);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STEP_PREDICTION_H_
