// PartitionPlanner's public entry points: request validation, the
// evaluation of a placement under the cost model, the explanation, and the
// messages for plans that cannot exist. The model is computed by
// planner_cost_model.h; the search lives in planner_search.cc (driver) and
// planner_dp.cc (dynamic programs).
//
// Cost model, per micro-batch:
//  * Compute: worker w runs layer l in (forward_l + backward_l) / speed_w; a
//    stage's compute is the sum over its layers, taken from prefix sums
//    (O(1) per stage; rounding relative to the whole model's work, ~1e-16),
//    plus message_overhead for each message it sends or receives (an
//    activation and a gradient per neighbour: 2 or 4 per micro-batch).
//  * Links are per worker pair (LinkBetween): the operator's zone override
//    (--zone_bandwidth, --zone_latency) if one covers the pair, else the
//    pair's measured link (Probe: bandwidth and RTT; this direction, else
//    the reverse), else the zone default bandwidth with no latency.
//  * Bytes are as encoded on the wire: a layer's activation_wire_bytes go
//    down and its gradient_wire_bytes come back up (spec/wire_size.h: the
//    wire dtype, or int8 / int4 codes with a scale and offset per group).
//  * Transfer of the link after stage s: its occupancy per micro-batch,
//    max(activation / bandwidth(s -> s+1), gradient / bandwidth(s+1 -> s)):
//    the two directions are separate flows and run at once. Latency of
//    that link: RTT / 2, the two directions averaged.
//  * Stage time = max(compute, transfer): a stage's sends queue and return
//    at once, so a link moves one micro-batch while the stages compute
//    others; the bottleneck is the largest stage time, and a link slower
//    than the slowest stage's compute is the bottleneck. The search
//    minimizes it.
//  * Memory = parameter bytes * (2 + optimizer_state_factor) for weights,
//    gradients and optimizer state, plus activations. With "held" the sum of
//    the stage's layers' activation_bytes and "input" the bytes entering the
//    stage (activation_bytes of layer begin - 1; 0 for the first stage, whose
//    input is the data batch, not a profiled activation):
//      GPipe:          M * (held + input)
//      1F1B:           min(M, K - s) * (held + input)
//      Rematerialized: M * input + held  (inputs stashed, one mb recomputed)
//    K - s is "stages from s to the end", which a suffix search knows.
//
// Step time. PipelinePlan's predicted_step_seconds is the flush bound
// (M + K - 1) * bottleneck; bubble (K - 1) / (M + K - 1). The scheduler's
// plan (plan_builder.cc) replaces it for GPipe, 1F1B-flush and ZB-H1 by
// simulating the schedule's instruction streams (spec/simulator.cc) with
// each stage's forward and backward time, its optimizer update (after its
// last backward of the step) and each link's occupancy and latency per
// message; messages on one link queue behind each other. Schedules not
// simulated add the slowest stage's optimizer updates of a step to the
// flush bound. What
// follows from the simulation, with F_s + B_s a stage's compute, T_s its
// link's occupancy and L_s its latency:
//  * GPipe: all forwards, then all backwards. Steady state runs at the
//    bottleneck max_s(F_s + B_s, T_s) per micro-batch; fill pays every
//    link's T_s + L_s once on the way down (the first micro-batch's
//    activation), drain once on the way up (the last gradient): step ~=
//    (M + K - 1) * bottleneck + sum_s 2 (T_s + L_s) when compute dominates.
//  * 1F1B-flush: the same fill and drain, but in the steady state stage s
//    runs B of micro-batch m only after the gradient came back from s + 1,
//    a round trip of 2 L_s plus the downstream stages' work, with only
//    K - s micro-batches in flight to cover it: with short compute and a
//    long RTT the steady state waits for gradients and the step grows with
//    about M * RTT / (K - s), not only with K * RTT as GPipe's.
//  * ZB-H1: as 1F1B, with W passes filling the waits for gradients, so
//    less of the round trip shows.
// A worker reporting memory_bytes == 0 is unlimited.
//
// Search: suffix dynamic programming over (first layer e, stages left r,
// link class of the first stage), minimizing the bottleneck; stages are
// contiguous layer ranges on distinct workers. Link classes are zones when
// no link was measured, else every worker (per-pair links). Up to 7
// workers the workers still free are part of the state, which is exact
// over every ordered choice of workers (equivalent to trying all
// permutations, without repeating shared suffixes); beyond, the workers
// must follow one of three orders (grouped by zone along the fastest zone
// chain with the fastest worker first in each zone; as given; fastest
// first), skipping allowed. One pass yields the best bottleneck for every
// K; num_stages == 0 picks the K minimizing the flush bound, ties to fewer
// stages. Bounds from the best plan so far (first from speed-proportional
// splits) prune the search without changing its answer. Complexity in
// planner_dp.h.
#include "scheduler/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "scheduler/planner_cost_model.h"
#include "scheduler/planner_search.h"

namespace pipetrain {

using planner_internal::StageCostModel;

namespace {

double FindUnordered(
    const std::map<std::pair<std::string, std::string>, double>& table,
    const std::string& a, const std::string& b) {
  auto it = table.find({a, b});
  if (it == table.end()) it = table.find({b, a});
  return it == table.end() ? -1.0 : it->second;
}

}  // namespace

double Topology::BandwidthOverride(const std::string& a,
                                   const std::string& b) const {
  return FindUnordered(bandwidth, a, b);
}

double Topology::RttOverride(const std::string& a, const std::string& b) const {
  return FindUnordered(rtt, a, b);
}

double Topology::Bandwidth(const std::string& a, const std::string& b) const {
  const double fixed = BandwidthOverride(a, b);
  if (fixed >= 0) return fixed;
  return a == b ? intra_zone_bandwidth : default_bandwidth;
}

LinkEstimate LinkBetween(const PlanRequest& request, const PlannerWorker& from,
                         const PlannerWorker& to) {
  const Topology& topology = request.topology;
  const LinkEstimate* measured = nullptr;
  auto it = request.links.find({from.id, to.id});
  if (it == request.links.end()) it = request.links.find({to.id, from.id});
  if (it != request.links.end()) measured = &it->second;
  LinkEstimate out;
  const double bandwidth = topology.BandwidthOverride(from.zone, to.zone);
  const double rtt = topology.RttOverride(from.zone, to.zone);
  if (bandwidth >= 0) {
    out.bandwidth_bytes_per_s = bandwidth;
    out.source = "override";
  } else if (measured != nullptr) {
    out.bandwidth_bytes_per_s = measured->bandwidth_bytes_per_s;
    out.source = "probe";
  } else {
    out.bandwidth_bytes_per_s = topology.Bandwidth(from.zone, to.zone);
    out.source = "default";
  }
  if (rtt >= 0) {
    out.rtt_seconds = rtt;
    out.source = "override";
  } else if (measured != nullptr) {
    out.rtt_seconds = measured->rtt_seconds;
  }
  return out;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

bool IsPositiveFinite(double x) { return std::isfinite(x) && x > 0.0; }
bool IsNonNegativeFinite(double x) { return std::isfinite(x) && x >= 0.0; }

absl::Status ValidateLayers(const std::vector<LayerCost>& layers) {
  if (layers.empty()) return absl::InvalidArgumentError("no layers to place");
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerCost& layer = layers[l];
    if (!IsNonNegativeFinite(layer.forward_seconds) ||
        !IsNonNegativeFinite(layer.backward_seconds) ||
        !IsNonNegativeFinite(layer.optimizer_seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": times must be finite and non-negative"));
    }
    if (layer.activation_bytes < 0 || layer.parameter_bytes < 0 ||
        layer.activation_wire_bytes < -1 || layer.gradient_wire_bytes < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": byte counts must be non-negative"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkers(const std::vector<PlannerWorker>& workers) {
  if (workers.empty()) return absl::InvalidArgumentError("no workers");
  std::set<std::string> ids;
  for (size_t w = 0; w < workers.size(); ++w) {
    const PlannerWorker& worker = workers[w];
    if (!IsPositiveFinite(worker.speed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker.id, ": speed must be positive, got ",
                       worker.speed));
    }
    if (worker.memory_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker.id, ": negative memory"));
    }
    if (!ids.insert(worker.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker id '", worker.id, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTopology(const Topology& topology) {
  if (!IsPositiveFinite(topology.intra_zone_bandwidth) ||
      !IsPositiveFinite(topology.default_bandwidth)) {
    return absl::InvalidArgumentError("bandwidths must be positive");
  }
  for (const auto& [zones, bandwidth] : topology.bandwidth) {
    if (!IsPositiveFinite(bandwidth)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bandwidth between ", zones.first, " and ", zones.second,
                       " must be positive"));
    }
    // Pairs are unordered, so (a, b) and (b, a) must agree.
    auto mirror = topology.bandwidth.find({zones.second, zones.first});
    if (mirror != topology.bandwidth.end() && mirror->second != bandwidth) {
      return absl::InvalidArgumentError(
          absl::StrCat("bandwidth between ", zones.first, " and ", zones.second,
                       " is given twice, differently"));
    }
  }
  for (const auto& [zones, rtt] : topology.rtt) {
    if (!IsNonNegativeFinite(rtt)) {
      return absl::InvalidArgumentError(
          absl::StrCat("latency between ", zones.first, " and ", zones.second,
                       " must be finite and non-negative"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLinks(const PlanRequest& request) {
  for (const auto& [pair, link] : request.links) {
    if (!IsPositiveFinite(link.bandwidth_bytes_per_s) ||
        !IsNonNegativeFinite(link.rtt_seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("link ", pair.first, " -> ", pair.second,
                       ": bandwidth must be positive and RTT non-negative"));
    }
  }
  if (!IsNonNegativeFinite(request.message_overhead_seconds)) {
    return absl::InvalidArgumentError(
        "message_overhead_seconds must be finite and non-negative");
  }
  if (!IsNonNegativeFinite(request.stream_extra_seconds)) {
    return absl::InvalidArgumentError(
        "stream_extra_seconds must be finite and non-negative");
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const PlanRequest& request) {
  RETURN_IF_ERROR(ValidateLayers(request.layers));
  RETURN_IF_ERROR(ValidateWorkers(request.workers));
  RETURN_IF_ERROR(ValidateTopology(request.topology));
  RETURN_IF_ERROR(ValidateLinks(request));
  if (request.micro_batches < 1) {
    return absl::InvalidArgumentError("micro_batches must be at least 1");
  }
  if (request.num_stages < 0) {
    return absl::InvalidArgumentError("num_stages must not be negative");
  }
  if (!IsNonNegativeFinite(request.optimizer_state_factor)) {
    return absl::InvalidArgumentError(
        "optimizer_state_factor must be finite and non-negative");
  }
  switch (request.memory) {
    case MemoryModel::kGPipe:
    case MemoryModel::kOneFOneB:
    case MemoryModel::kRematerialized:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown memory model");
}

absl::Status ValidatePlacement(const PlanRequest& request,
                               const std::vector<StageAssignment>& stages) {
  if (stages.empty()) return absl::InvalidArgumentError("no stages");
  const int layers = static_cast<int>(request.layers.size());
  const int workers = static_cast<int>(request.workers.size());
  std::vector<int> holder(workers, -1);
  int expected_begin = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageAssignment& stage = stages[s];
    if (stage.layer_begin != expected_begin ||
        stage.layer_end <= stage.layer_begin || stage.layer_end > layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", s, ": layers [", stage.layer_begin, ", ",
                       stage.layer_end, ") do not continue at layer ",
                       expected_begin, " within ", layers, " layers"));
    }
    if (stage.worker < 0 || stage.worker >= workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, ": no worker ", stage.worker, " among ", workers));
    }
    if (holder[stage.worker] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", stage.worker, " holds stages ",
                       holder[stage.worker], " and ", s));
    }
    holder[stage.worker] = static_cast<int>(s);
    expected_begin = stage.layer_end;
  }
  if (expected_begin != layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stages cover layers [0, ", expected_begin, ") of ", layers));
  }
  return absl::OkStatus();
}

std::string MemoryText(double bytes) {
  return absl::StrFormat("%.1f MiB", bytes / kMiB);
}

std::string Explain(const PlanRequest& request, const PipelinePlan& plan) {
  std::string text;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StageAssignment& stage = plan.stages[s];
    const PlannerWorker& worker = request.workers[stage.worker];
    const std::string capacity =
        worker.memory_bytes == 0
            ? std::string("unlimited")
            : MemoryText(static_cast<double>(worker.memory_bytes));
    absl::StrAppendFormat(
        &text,
        "stage %d: layers [%d, %d) on worker %s (zone %s): compute %.3f ms "
        "| transfer %.3f ms + latency %.3f ms, memory %s of %s\n",
        s, stage.layer_begin, stage.layer_end, worker.id, worker.zone,
        stage.compute_seconds * 1e3, stage.transfer_seconds * 1e3,
        stage.latency_seconds * 1e3,
        MemoryText(static_cast<double>(stage.memory_bytes)), capacity);
  }
  absl::StrAppendFormat(
      &text,
      "bottleneck: stage %d (%.3f ms); (M + K - 1) x bottleneck %.3f ms; "
      "bubble %.1f%%",
      plan.bottleneck_stage, plan.bottleneck_seconds * 1e3,
      plan.predicted_step_seconds * 1e3, plan.predicted_bubble * 100.0);
  return text;
}

int64_t CeilBytes(double bytes) {
  constexpr double kMax = 9.2e18;  // just under INT64_MAX
  return bytes >= kMax ? INT64_MAX : static_cast<int64_t>(std::ceil(bytes));
}

// Fills every figure of a placement already known to be well formed.
PipelinePlan Evaluate(const PlanRequest& request, const StageCostModel& model,
                      std::vector<StageAssignment> stages) {
  PipelinePlan plan;
  const int k = static_cast<int>(stages.size());
  for (int s = 0; s < k; ++s) {
    StageAssignment& stage = stages[s];
    stage.compute_seconds =
        model.ComputeSeconds(stage.layer_begin, stage.layer_end, stage.worker);
    stage.transfer_seconds = model.StageTransferSeconds(stages, s);
    stage.latency_seconds =
        s + 1 < k ? model.LatencySeconds(model.zone(stage.worker),
                                         model.zone(stages[s + 1].worker))
                  : 0.0;
    const double memory =
        model.MemoryBytes(stage.layer_begin, stage.layer_end, k - s);
    stage.memory_bytes = CeilBytes(memory);
    plan.fits_memory &= memory <= model.MemoryCapacity(stage.worker);
    const double time = std::max(stage.compute_seconds, stage.transfer_seconds);
    if (s == 0 || time > plan.bottleneck_seconds) {
      plan.bottleneck_seconds = time;
      plan.bottleneck_stage = s;
    }
  }
  const double slots = request.micro_batches + k - 1.0;
  plan.predicted_step_seconds = slots * plan.bottleneck_seconds;
  plan.predicted_bubble = (k - 1.0) / slots;
  plan.stages = std::move(stages);
  plan.explanation = Explain(request, plan);
  return plan;
}

// A layer alone as the last stage is the least any placement asks of it.
absl::Status CheckEachLayerFits(const StageCostModel& model) {
  double largest = 0.0;
  for (int w = 0; w < model.num_workers(); ++w) {
    largest = std::max(largest, model.MemoryCapacity(w));
  }
  for (int l = 0; l < model.num_layers(); ++l) {
    const double need = model.MemoryBytes(l, l + 1, 1);
    if (need > largest) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "layer %d alone needs %.1f GiB but the largest worker has %.1f GiB",
          l, need / kGiB, largest / kGiB));
    }
  }
  return absl::OkStatus();
}

// Weights, gradients and optimizer state must live somewhere, whatever the
// cut.
absl::Status CheckStateFitsInTotal(const PlanRequest& request,
                                   const StageCostModel& model) {
  double total = 0.0;
  for (int w = 0; w < model.num_workers(); ++w) {
    total += model.MemoryCapacity(w);
  }
  double state = 0.0;
  for (const LayerCost& layer : request.layers) {
    state += layer.parameter_bytes * (2.0 + request.optimizer_state_factor);
  }
  if (state <= total) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "no placement fits in memory: weights, gradients and optimizer state "
      "need %.1f GiB but all %d workers together have %.1f GiB",
      state / kGiB, model.num_workers(), total / kGiB));
}

// Why the search found nothing, most specific reason first.
absl::Status NoFitError(const PlanRequest& request,
                        const StageCostModel& model) {
  RETURN_IF_ERROR(CheckEachLayerFits(model));
  RETURN_IF_ERROR(CheckStateFitsInTotal(request, model));
  const std::string stages = request.num_stages > 0
                                 ? absl::StrCat(request.num_stages, " stages")
                                 : std::string("any number of stages");
  const bool exact =
      model.num_workers() <= planner_internal::kExactSearchMaxWorkers;
  return absl::FailedPreconditionError(absl::StrCat(
      "no placement fits in memory: ", exact ? "every" : "every searched",
      " cut of the ", model.num_layers(), " layers into ", stages, " on the ",
      model.num_workers(), " workers leaves a stage over its worker's memory"));
}

absl::Status CheckStageCount(const PlanRequest& request) {
  const int k = request.num_stages;
  const int workers = static_cast<int>(request.workers.size());
  const int layers = static_cast<int>(request.layers.size());
  if (k > workers) {
    return absl::FailedPreconditionError(
        absl::StrCat("num_stages ", k, " needs ", k, " workers, only ", workers,
                     " available"));
  }
  if (k > layers) {
    return absl::FailedPreconditionError(
        absl::StrCat("num_stages ", k, " needs ", k,
                     " layers, the model has only ", layers));
  }
  const int max_stages = k > 0 ? k : std::min(layers, workers);
  if (planner_internal::SearchTableEntries(layers, workers, max_stages) >
      planner_internal::kMaxSearchTableEntries) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "planning ", layers, " layers on ", workers, " workers with up to ",
        max_stages, " stages needs more than ",
        planner_internal::kMaxSearchTableEntries, " table entries"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PipelinePlan> PlanPipeline(const PlanRequest& request) {
  RETURN_IF_ERROR(ValidateRequest(request));
  RETURN_IF_ERROR(CheckStageCount(request));
  const StageCostModel model(request);
  std::vector<StageAssignment> stages =
      planner_internal::SearchPlacement(model, request.num_stages);
  if (stages.empty()) return NoFitError(request, model);
  return Evaluate(request, model, std::move(stages));
}

absl::StatusOr<PipelinePlan> EvaluatePlacement(
    const PlanRequest& request, const std::vector<StageAssignment>& stages) {
  RETURN_IF_ERROR(ValidateRequest(request));
  RETURN_IF_ERROR(ValidatePlacement(request, stages));
  return Evaluate(request, StageCostModel(request), stages);
}

std::vector<StageAssignment> EvenSplit(int num_layers, int num_stages) {
  std::vector<StageAssignment> stages;
  if (num_stages < 1 || num_layers < num_stages) return stages;
  const int base = num_layers / num_stages;
  const int longer = num_layers % num_stages;  // the first stages get +1
  int begin = 0;
  for (int k = 0; k < num_stages; ++k) {
    StageAssignment stage;
    stage.layer_begin = begin;
    stage.layer_end = begin + base + (k < longer ? 1 : 0);
    stage.worker = k;
    stages.push_back(stage);
    begin = stage.layer_end;
  }
  return stages;
}

}  // namespace pipetrain
