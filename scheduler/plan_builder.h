// Plan building: from a job spec, the layer profile of one worker (and of
// one worker per other kind: worker_kinds.h) and the idle workers to the
// v1::Plan the scheduler launches, including the interleaved
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
// The predicted step of GPipe, 1F1B-flush and ZB-H1 comes from simulating
// the schedule (spec/simulator.cc) with every stage's forward and backward
// time, each link's occupancy per message and its latency (see the model at
// the top of planner.cc); the other schedules use M * bottleneck / (1 -
// bubble).
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_PLAN_BUILDER_H_
#define PIPETRAIN_SCHEDULER_PLAN_BUILDER_H_

#include <functional>
#include <map>
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

// The request to profile `spec`'s layers as its stages will run them: the
// training spec, `repetitions` runs, and reuse_weights where the stages
// keep their weights laid out across a step's micro-batches (a synchronous
// schedule with more than one micro-batch; StageCompute::Build decides the
// same).
v1::ProfileRequest ProfileRequestFor(const v1::JobSpec& spec, int repetitions);

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
  // Profiles measured on other workers, by worker id: one per worker kind
  // besides workers[0]'s sets that kind's speed; a kind without one is
  // scaled by GEMM speed (worker_kinds.h).
  std::map<std::string, v1::ProfileResponse> kind_profiles;
  // Candidates, idle and matching the job's selector; at least one.
  std::vector<v1::WorkerInfo> workers;
  // Zone overrides and defaults; the workers' measured links
  // (WorkerInfo.links, source "probe") come with `workers`.
  Topology topology;
  // Stage time per stream message a stage sends or receives
  // (PlanRequest::message_overhead_seconds); negative: measured
  // (MessageOverhead).
  double message_overhead_seconds = -1.0;
  // The schedule's idle fraction on K workers (ModelSupport).
  std::function<double(int num_stages)> bubble;
};

// Bytes one micro-batch's output of each layer takes on the wire, down
// (activation) and up (gradient), per the job's wire dtype and compression
// (spec/wire_size.h); empty when the model spec is invalid.
struct LayerWireBytes {
  int64_t activation = 0;
  int64_t gradient = 0;
};
std::vector<LayerWireBytes> WireBytesPerLayer(const v1::JobSpec& spec);

// `workers`' links as the planner will use them: measured ones, replaced
// by the topology's overrides where one covers the pair (source
// "override"), plus override entries for pairs not measured.
void ApplyLinkOverrides(const Topology& topology,
                        std::vector<v1::WorkerInfo>* workers);

// The plan, or the planner's error (FailedPrecondition with the reason when
// nothing fits). planning_seconds is left to the caller, who also timed
// the profile.
absl::StatusOr<v1::Plan> BuildPlan(const PlanInputs& inputs);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLAN_BUILDER_H_
