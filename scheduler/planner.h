// PartitionPlanner: cuts a model's layer sequence into pipeline stages and
// places each stage on a worker, so that the slowest stage (compute plus
// transfer to its neighbour) is as fast as possible within every worker's
// memory. PipeDream-style dynamic programming over layers and workers.
//
// Pure and transport-free: inputs are measured profiles and worker facts,
// the output a plan with its explanation.
#ifndef PIPETRAIN_SCHEDULER_PLANNER_H_
#define PIPETRAIN_SCHEDULER_PLANNER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain {

// One layer's measured costs for one micro-batch on the reference device.
struct LayerCost {
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  // The optimizer's update of the layer's parameters, once per optimizer
  // step (not per micro-batch): the stage that holds the layer runs it
  // after its last backward pass of the step.
  double optimizer_seconds = 0.0;
  // Bytes of the layer's output for one micro-batch (what crosses a stage
  // boundary after this layer, and what a stage keeps per micro-batch).
  int64_t activation_bytes = 0;
  int64_t parameter_bytes = 0;
  // Bytes the activation (down) and its gradient (up) take on the wire per
  // micro-batch, as encoded (wire dtype, compression: spec/wire_size.h);
  // -1: activation_bytes.
  int64_t activation_wire_bytes = -1;
  int64_t gradient_wire_bytes = -1;

  // What the activation and its gradient take on the wire: the wire
  // figures, else activation_bytes.
  int64_t ActivationOnWire() const {
    return activation_wire_bytes >= 0 ? activation_wire_bytes
                                      : activation_bytes;
  }
  int64_t GradientOnWire() const {
    return gradient_wire_bytes >= 0 ? gradient_wire_bytes : activation_bytes;
  }
};

struct PlannerWorker {
  std::string id;
  // Relative speed: a layer takes reference_time / speed on this worker.
  double speed = 1.0;
  int64_t memory_bytes = 0;
  std::string zone;
  // The machine it runs on (WorkerInfo.host_id; empty: unknown) and the
  // CPUs it may use there (0: unknown): workers on one machine share them.
  std::string host_id;
  int host_cpus = 0;
};

// Links between zones, as the operator's flags give them. `bandwidth`
// (bytes per second) and `rtt` (seconds) pairs are unordered overrides: they
// win over measured links. A pair with neither an override nor a
// measurement uses `default_bandwidth` (same zone: `intra_zone_bandwidth`)
// and no latency.
struct Topology {
  double intra_zone_bandwidth = 10e9;
  double default_bandwidth = 1e9;
  std::map<std::pair<std::string, std::string>, double> bandwidth;
  std::map<std::pair<std::string, std::string>, double> rtt;
  // The override or the default.
  double Bandwidth(const std::string& a, const std::string& b) const;
  // The override for the pair, if any (-1 when none).
  double BandwidthOverride(const std::string& a, const std::string& b) const;
  double RttOverride(const std::string& a, const std::string& b) const;
};

// One direction of a link between two workers.
struct LinkEstimate {
  double bandwidth_bytes_per_s = 0.0;
  double rtt_seconds = 0.0;
  // "probe", "override" or "default".
  std::string source;
};

enum class MemoryModel {
  kGPipe,           // every micro-batch's activations live until backward
  kOneFOneB,        // stage s holds at most K - s micro-batches
  kRematerialized,  // GPipe holding only stage inputs, plus one micro-batch
};

struct PlanRequest {
  std::vector<LayerCost> layers;
  std::vector<PlannerWorker> workers;
  Topology topology;
  // Measured links by (from worker id, to worker id), directed. A link
  // without a measurement uses the reverse direction's, else the topology's
  // defaults; the topology's overrides win over both (LinkBetween).
  std::map<std::pair<std::string, std::string>, LinkEstimate> links;
  // Stage time per message a stage sends or receives (activation or
  // gradient), e.g. the local stream's encode and hand-off.
  double message_overhead_seconds = 0.0;
  // CPU per message end, every thread of the process counted (gRPC's
  // pollers, TLS): what it takes from the CPUs a machine's workers share.
  double message_cpu_seconds = 0.0;
  // The CPU each byte of a message's payload adds to each of its ends
  // (MessageCpuPerByte): a message end takes message_cpu_seconds plus its
  // wire bytes times this.
  double message_cpu_seconds_per_byte = 0.0;
  // What a message's way along a stage stream takes beyond what the plan
  // already charges it (the link's one-way latency and
  // message_overhead_seconds at each end): StreamExtraLatency. Added to
  // each message's latency by SimulatedStep.
  double stream_extra_seconds = 0.0;
  int micro_batches = 1;
  // 0: any number of stages up to min(#layers, #workers); else exactly.
  int num_stages = 0;
  MemoryModel memory = MemoryModel::kGPipe;
  // kOneFOneB under a cross-step schedule with extra warm-up
  // (JobSpec.extra_warmup): a stage with r stages from it to the end holds
  // (r - 1) * (1 + extra_warmup) + 1 micro-batches instead of min(M, r).
  int extra_warmup = 0;
  // Bytes of optimizer state per parameter byte (SGD with momentum 1,
  // AdamW 2), on top of the weights and their gradients.
  double optimizer_state_factor = 1.0;
};

struct StageAssignment {
  int layer_begin = 0;  // [begin, end)
  int layer_end = 0;
  int worker = 0;  // index into PlanRequest::workers
  // Forward + backward per micro-batch, plus the per-message overhead of
  // the messages the stage sends and receives.
  double compute_seconds = 0.0;
  // The link to the next stage's occupancy per micro-batch: the slower of
  // activation down and gradient up (the directions run in parallel), 0 for
  // the last stage.
  double transfer_seconds = 0.0;
  // That link's one-way latency (RTT / 2, both directions averaged).
  double latency_seconds = 0.0;
  int64_t memory_bytes = 0;
};

struct PipelinePlan {
  std::vector<StageAssignment> stages;
  // max over stages of max(compute, transfer): a stage's sends overlap
  // its compute of other micro-batches.
  double bottleneck_seconds = 0.0;
  int bottleneck_stage = 0;
  // (M + K - 1) * bottleneck for flush schedules.
  double predicted_step_seconds = 0.0;
  double predicted_bubble = 0.0;  // (K - 1) / (M + K - 1)
  std::string explanation;        // human-readable, one line per stage
  // Every stage within its worker's memory. Always true for PlanPipeline;
  // EvaluatePlacement reports placements that overflow instead of failing.
  bool fits_memory = true;
};

// The link from `from` to `to` the cost model uses: the topology's
// override for their zones, else the measured link (this direction, else
// the reverse), else the zone default; bandwidth and RTT are resolved
// separately.
LinkEstimate LinkBetween(const PlanRequest& request, const PlannerWorker& from,
                         const PlannerWorker& to);

// The best plan. InvalidArgument for malformed requests (no layers, no
// workers, non-positive speeds); FailedPrecondition with the reason when no
// placement fits (too little memory, too few workers for num_stages);
// ResourceExhausted when the search tables would pass 512 MiB (far beyond
// 1,000 layers on 64 workers). Exact up to 7 workers; beyond, the best over
// a few heuristic worker orders (as given, grouped by zone, fastest first).
// Deterministic; pure, so safe to call from any thread.
absl::StatusOr<PipelinePlan> PlanPipeline(const PlanRequest& request);

// Evaluates a given placement (same cost model), e.g. the even split.
// InvalidArgument when the request or the placement is malformed (stages not
// contiguous from layer 0 to the end, unknown or repeated workers).
// A placement that overflows memory is evaluated, with fits_memory false.
absl::StatusOr<PipelinePlan> EvaluatePlacement(
    const PlanRequest& request, const std::vector<StageAssignment>& stages);

// Layers split as evenly as possible (by count) over the first K workers;
// the first (num_layers % K) stages get the extra layers. Empty when
// num_stages < 1 or num_stages > num_layers.
std::vector<StageAssignment> EvenSplit(int num_layers, int num_stages);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLANNER_H_
