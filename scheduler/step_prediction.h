// The step time a placement predicts: the job's schedule simulated over
// the placement's stage and link costs (spec/simulator.cc), the optimizer
// updates a step puts on the slowest worker's critical path, for the
// schedules the step is not simulated for, and the floor that machines
// shared by several stages put under it; and the per-message figures
// these charge, from what the workers measured. Used by BuildPlan
// (plan_builder.h). Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_STEP_PREDICTION_H_
#define PIPETRAIN_SCHEDULER_STEP_PREDICTION_H_

#include <string>
#include <vector>

#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/planner.h"

namespace pipetrain {

// The per-message overhead a plan charges: `configured` when >= 0, else
// measured: the median of what `workers` measured on their own gRPC stacks
// (WorkerInfo.message_overhead_seconds), or, when none did, a quarter of
// the median RTT over their probed links (0 when none was probed). A
// probe's round trip is two messages through the same gRPC stack the stage
// streams use, and each message costs its sender and its receiver, so a
// quarter of it is one end's share of one message; across a WAN the link's
// round trip is mostly the network's, hence the workers' own figure first.
double MessageOverhead(double configured,
                       const std::vector<v1::WorkerInfo>& workers);
// The CPU one message end takes (PlanRequest::message_cpu_seconds): the
// median of what the workers measured (WorkerInfo.message_cpu_seconds), else
// `overhead_seconds` (MessageOverhead's figure).
double MessageCpu(double overhead_seconds,
                  const std::vector<v1::WorkerInfo>& workers);
// The CPU a byte of payload adds to a message end
// (PlanRequest::message_cpu_seconds_per_byte): the median of what the
// workers measured (WorkerInfo.message_cpu_seconds_per_byte), 0 when none
// did.
double MessageCpuPerByte(const std::vector<v1::WorkerInfo>& workers);
// PlanRequest::stream_extra_seconds: 0 when `configured` >= 0 (the flag
// sets the message costs), else the median over the workers that measured
// both of stream_hop_seconds - 4 x message_overhead_seconds, at least 0
// (0 when none did). A plan charges a message the one-way time of its
// link's Probe round trips (on the worker's own stack, two message ends,
// 2 x the overhead) and the overhead again at each end; the stream's
// measured hop, from the sending thread to the woken receiving thread, is
// the whole way on that stack.
double StreamExtraLatency(double configured,
                          const std::vector<v1::WorkerInfo>& workers);
// Where MessageOverhead's figure comes from, in words, for the plan's
// explanation.
std::string MessageOverheadSource(double configured,
                                  const std::vector<v1::WorkerInfo>& workers);

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
// latency later (the link's one-way time plus
// request.stream_extra_seconds). Where the workers' machines are known
// (PlannerWorker::host_id, host_cpus) the stages and their messages share
// each machine's CPUs (SimMachines): a message end takes
// request.message_cpu_seconds, plus message_cpu_seconds_per_byte for each
// of its wire bytes, less the overhead its stage's pass already charges, on
// its machine's CPUs, before the message arrives; then `note` (when given)
// says so, else it is left empty.
double SimulatedStep(const v1::JobSpec& spec, const PlanRequest& request,
                     const std::vector<StageAssignment>& stages,
                     std::string* note = nullptr);

// A step's floor where stages share a machine's CPUs: on each machine
// (PlannerWorker::host_id; workers with no id or no CPU count are left
// out), the CPU its stages spend in a step, divided by its CPUs. A stage's
// CPU in a step: its forward and backward passes over the step's
// micro-batches, its optimizer updates, and the CPU of each message end
// (each micro-batch's activation and gradient, sent and received, on each
// side that has a neighbour: request.message_cpu_seconds plus
// message_cpu_seconds_per_byte for each wire byte). Stages on one machine run
// their passes at once only while it has a free CPU for each; gRPC's
// threads take from the same CPUs. `seconds` is the largest machine's
// floor (0 when none is known); `explanation` a line for each machine
// shared by two or more stages ("" when none).
struct SharedCpuBound {
  double seconds = 0.0;
  std::string explanation;
};
SharedCpuBound SharedCpuStep(const v1::JobSpec& spec,
                             const PlanRequest& request,
                             const std::vector<StageAssignment>& stages,
                             int chunks_per_worker);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STEP_PREDICTION_H_
