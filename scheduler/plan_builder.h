// Plan building: from a job spec, one worker's layer profile and the idle
// workers to the v1::Plan the scheduler launches, including the interleaved
// schedule's chunks and the predicted step time. Also the spec checks that
// planning relies on.
//
// Interleaving (SCHEDULE_INTERLEAVED, v chunks per worker): the partition
// planner picks K workers and their order; the layers are then cut into
// K * v chunks of equal profiled compute, and worker s holds chunks s,
// K + s, 2K + s, ... Every figure of such a plan (layer ranges, compute,
// transfer, memory) describes the chunks a worker really holds, computed
// with the planner's cost model over the K * v virtual stages; a worker
// whose chunks do not fit its memory fails the plan, with the numbers.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_PLAN_BUILDER_H_
#define PIPETRAIN_SCHEDULER_PLAN_BUILDER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "scheduler/planner.h"

namespace pipetrain {

// Model chunks per worker: spec.virtual_stages (default 2) for
// SCHEDULE_INTERLEAVED, else 1.
int ChunksPerWorker(const v1::JobSpec& spec);

// What a job spec must satisfy for planning, beyond the model's own rules:
// InvalidArgument naming the field (stage count vs layers, vertical sync,
// interleaving's divisibility); FailedPrecondition when it asks for more
// stages than `alive_workers`.
absl::Status CheckJobSpec(const v1::JobSpec& spec, int alive_workers);

struct PlanInputs {
  std::string job_id;
  v1::JobSpec spec;
  // Per-layer costs measured on workers[0] (the reference for speeds).
  v1::ProfileResponse profile;
  // Candidates, idle and matching the job's selector; at least one.
  std::vector<v1::WorkerInfo> workers;
  Topology topology;
  // The schedule's idle fraction on K workers (ModelSupport).
  std::function<double(int num_stages)> bubble;
};

// The plan, or the planner's error (FailedPrecondition with the reason when
// nothing fits). planning_seconds is left to the caller, who also timed
// the profile.
absl::StatusOr<v1::Plan> BuildPlan(const PlanInputs& inputs);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLAN_BUILDER_H_
