#include "scheduler/plan_builder.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "scheduler/step_prediction.h"
#include "scheduler/warmup_choice.h"
#include "scheduler/worker_kinds.h"
#include "spec/job_spec.h"
#include "spec/model_spec.h"
#include "spec/schedule.h"
#include "spec/vocabulary.h"
#include "spec/wire_size.h"

namespace pipetrain {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

int64_t MicroBatches(const v1::JobSpec& spec) {
  return std::max<int64_t>(1, spec.training().micro_batches());
}

MemoryModel MemoryFor(const v1::JobSpec& spec) {
  if (spec.training().rematerialize()) return MemoryModel::kRematerialized;
  // A stage holding its weight-gradient products keeps each finished
  // micro-batch's linear inputs and output gradients until the update
  // (DefersWeightGrads), up to kMaxHeldWeightGradRows rows: with the
  // micro-batches still in flight, no more than GPipe's bound.
  const absl::StatusOr<ScheduleKind> kind =
      ScheduleKindFromProto(spec.schedule());
  const int64_t m = MicroBatches(spec);
  if (kind.ok() &&
      DefersWeightGrads(*kind, static_cast<int>(m),
                        spec.training().rematerialize()) &&
      HeldWeightGradMicroBatches(spec.training().batch_size() / m) > 0) {
    return MemoryModel::kGPipe;
  }
  // ZB-H1 holds as many micro-batches as 1F1B (until their B pass).
  return spec.schedule() == v1::SCHEDULE_1F1B_FLUSH ||
                 spec.schedule() == v1::SCHEDULE_ZB_H1 ||
                 spec.schedule() == v1::SCHEDULE_ASYNC_1F1B ||
                 spec.schedule() == v1::SCHEDULE_2BW
             ? MemoryModel::kOneFOneB
             : MemoryModel::kGPipe;
}

double OptimizerStateFactor(const v1::OptimizerSpec& o) {
  if (o.has_adamw()) return 2.0;
  return o.has_sgd() && o.sgd().momentum() != 0 ? 1.0 : 0.0;
}

// Interleaving: the worker count K for `workers` idle workers (the largest
// that divides M and leaves every one of the K * v chunks a layer).
int InterleavedStageCount(const v1::JobSpec& spec, int workers, int v) {
  if (spec.num_stages() > 0) return spec.num_stages();
  const int64_t m = MicroBatches(spec);
  const int layers = spec.training().model().layers_size();
  for (int k = std::min(workers, layers / v); k > 1; --k) {
    if (m % k == 0) return k;
  }
  return 1;
}

// Cuts `layers` into `chunks` contiguous non-empty ranges of about equal
// compute, as boundaries b[0] = 0 < ... < b[chunks] = layers: each cut is
// the boundary nearest its share of the total (not the first one past it,
// which rounding in the prefix sums can push one layer too far).
std::vector<int> BalancedCuts(const std::vector<LayerCost>& layers,
                              int chunks) {
  const int n = static_cast<int>(layers.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    prefix[i + 1] =
        prefix[i] + layers[i].forward_seconds + layers[i].backward_seconds;
  }
  std::vector<int> cuts = {0};
  for (int j = 1; j < chunks; ++j) {
    const double target = prefix[n] * j / chunks;
    int b = cuts.back() + 1;
    while (b < n - (chunks - j) &&
           prefix[b + 1] - target < target - prefix[b]) {
      ++b;
    }
    cuts.push_back(b);
  }
  cuts.push_back(n);
  return cuts;
}

std::vector<int> EvenCuts(int layers, int chunks) {
  std::vector<int> cuts = {0};
  for (const StageAssignment& s : EvenSplit(layers, chunks)) {
    cuts.push_back(s.layer_end);
  }
  return cuts;
}

PlanRequest BuildRequest(const PlanInputs& in, const WorkerSpeeds& speeds) {
  PlanRequest request;
  const std::vector<LayerWireBytes> wire = WireBytesPerLayer(in.spec);
  for (const v1::LayerProfile& l : in.profile.layers()) {
    LayerCost c;
    c.forward_seconds = l.forward_seconds();
    c.backward_seconds = l.backward_seconds();
    c.optimizer_seconds = l.optimizer_seconds();
    c.activation_bytes = l.activation_bytes();
    c.parameter_bytes = l.parameter_bytes();
    const size_t i = request.layers.size();
    if (i < wire.size()) {
      c.activation_wire_bytes = wire[i].activation;
      c.gradient_wire_bytes = wire[i].gradient;
    }
    request.layers.push_back(c);
  }
  for (const v1::WorkerInfo& w : in.workers) {
    for (const v1::LinkMeasurement& l : w.links()) {
      if (l.source() != "probe" || !(l.bandwidth_bytes_per_s() > 0)) continue;
      request.links[{w.id(), l.to_worker_id()}] = {
          l.bandwidth_bytes_per_s(), std::max(0.0, l.rtt_seconds()), "probe"};
    }
  }
  request.message_overhead_seconds =
      MessageOverhead(in.message_overhead_seconds, in.workers);
  request.message_cpu_seconds =
      MessageCpu(request.message_overhead_seconds, in.workers);
  request.message_cpu_seconds_per_byte = MessageCpuPerByte(in.workers);
  request.stream_extra_seconds =
      StreamExtraLatency(in.message_overhead_seconds, in.workers);
  for (size_t i = 0; i < in.workers.size(); ++i) {
    const v1::WorkerInfo& w = in.workers[i];
    PlannerWorker p;
    p.id = w.id();
    p.speed = speeds.speed[i];
    p.memory_bytes = w.memory_bytes();
    p.host_id = w.host_id();
    p.host_cpus = w.host_cpus();
    auto zone = w.labels().find("zone");
    p.zone = zone == w.labels().end() ? "" : zone->second;
    request.workers.push_back(p);
  }
  request.topology = in.topology;
  request.micro_batches = static_cast<int>(MicroBatches(in.spec));
  request.num_stages = in.spec.num_stages();
  request.memory = MemoryFor(in.spec);
  // Auto (-1) is decided in BuildPlan once the stages are known.
  request.extra_warmup = std::max(0, in.spec.extra_warmup());
  request.optimizer_state_factor =
      OptimizerStateFactor(in.spec.training().optimizer());
  return request;
}

// What one worker holds and does per micro-batch.
struct WorkerLoad {
  std::vector<v1::LayerRange> chunks;
  double compute_seconds = 0;
  double transfer_seconds = 0;
  double memory_bytes = 0;
};

// The K * v virtual stages [cuts[j], cuts[j + 1]), virtual stage j on
// worker order[j % K], evaluated with the planner's cost model (one
// unlimited copy of the worker per chunk, so the wrap-around link and each
// chunk's memory are priced as the pipeline runs them) and summed per
// worker.
absl::StatusOr<std::vector<WorkerLoad>> ChunkLoads(
    const PlanRequest& request, const std::vector<int>& order,
    const std::vector<int>& cuts) {
  const int k = static_cast<int>(order.size());
  const int chunks = static_cast<int>(cuts.size()) - 1;
  PlanRequest virtual_request = request;
  virtual_request.workers.clear();
  std::vector<StageAssignment> placement;
  for (int j = 0; j < chunks; ++j) {
    PlannerWorker w = request.workers[order[j % k]];
    w.id = absl::StrCat(w.id, "#", j);
    w.memory_bytes = 0;
    virtual_request.workers.push_back(w);
    placement.push_back({cuts[j], cuts[j + 1], j});
  }
  virtual_request.num_stages = chunks;
  ASSIGN_OR_RETURN(PipelinePlan evaluated,
                   EvaluatePlacement(virtual_request, placement));
  std::vector<WorkerLoad> loads(k);
  for (int j = 0; j < chunks; ++j) {
    const StageAssignment& a = evaluated.stages[j];
    WorkerLoad& load = loads[j % k];
    v1::LayerRange range;
    range.set_begin(a.layer_begin);
    range.set_end(a.layer_end);
    load.chunks.push_back(range);
    load.compute_seconds += a.compute_seconds;
    load.transfer_seconds += a.transfer_seconds;
    load.memory_bytes += static_cast<double>(a.memory_bytes);
  }
  return loads;
}

double Bottleneck(const std::vector<WorkerLoad>& loads, int* stage) {
  double worst = -1;
  for (size_t s = 0; s < loads.size(); ++s) {
    // As the planner's stages: sends overlap the compute of other chunks.
    const double t =
        std::max(loads[s].compute_seconds, loads[s].transfer_seconds);
    if (t > worst) {
      worst = t;
      if (stage != nullptr) *stage = static_cast<int>(s);
    }
  }
  return worst;
}

std::string RangesText(const std::vector<v1::LayerRange>& chunks) {
  std::string out;
  for (const v1::LayerRange& r : chunks) {
    absl::StrAppend(&out, out.empty() ? "" : " ", "[", r.begin(), ", ", r.end(),
                    ")");
  }
  return out;
}

v1::PlannedStage* AddStage(const v1::WorkerInfo& worker, int stage,
                           v1::Plan* plan) {
  v1::PlannedStage* p = plan->add_stages();
  p->set_stage(stage);
  p->set_worker_id(worker.id());
  p->set_worker_address(worker.address());
  p->set_worker_identity(worker.identity());
  p->set_memory_limit_bytes(worker.memory_bytes());
  return p;
}

// The link to the next stage and the bytes a micro-batch sends over it.
void FillLink(const PlanRequest& request,
              const std::vector<StageAssignment>& stages, int s,
              v1::PlannedStage* p) {
  if (s + 1 >= static_cast<int>(stages.size())) return;
  const LinkEstimate link =
      LinkBetween(request, request.workers[stages[s].worker],
                  request.workers[stages[s + 1].worker]);
  p->set_link_bandwidth_bytes_per_s(link.bandwidth_bytes_per_s);
  p->set_link_rtt_seconds(link.rtt_seconds);
  const LayerCost& cut = request.layers[stages[s].layer_end - 1];
  p->set_wire_bytes_per_micro_batch(cut.ActivationOnWire() +
                                    cut.GradientOnWire());
}

// Contiguous stages, as the planner placed them.
void FillContiguous(const PlanInputs& in, const PlanRequest& request,
                    const PipelinePlan& planned, v1::Plan* out) {
  const int k = static_cast<int>(planned.stages.size());
  for (int s = 0; s < k; ++s) {
    const StageAssignment& a = planned.stages[s];
    v1::PlannedStage* p = AddStage(in.workers[a.worker], s, out);
    p->set_layer_begin(a.layer_begin);
    p->set_layer_end(a.layer_end);
    p->set_compute_seconds(a.compute_seconds);
    p->set_transfer_seconds(a.transfer_seconds);
    p->set_memory_bytes(a.memory_bytes);
    FillLink(request, planned.stages, s, p);
  }
  out->set_bottleneck_seconds(planned.bottleneck_seconds);
  out->set_bottleneck_stage(planned.bottleneck_stage);
  // The same workers with an even split of the layers, for comparison.
  std::vector<StageAssignment> even =
      EvenSplit(static_cast<int>(request.layers.size()), k);
  for (int s = 0; s < static_cast<int>(even.size()); ++s) {
    even[s].worker = planned.stages[s].worker;
  }
  auto evaluated = EvaluatePlacement(request, even);
  if (evaluated.ok()) {
    out->set_even_split_bottleneck_seconds(evaluated->bottleneck_seconds);
  }
  out->set_explanation(planned.explanation);
}

std::string MemoryError(const v1::WorkerInfo& worker, int stage,
                        const WorkerLoad& load) {
  return absl::StrFormat(
      "worker %s (stage %d) cannot hold its chunks %s: they need %d bytes "
      "(%.1f MiB), it has %d bytes (%.1f MiB)",
      worker.id(), stage, RangesText(load.chunks),
      static_cast<int64_t>(load.memory_bytes), load.memory_bytes / kMiB,
      worker.memory_bytes(), worker.memory_bytes() / kMiB);
}

// Interleaved: the planner's workers in its order, each holding v chunks.
absl::Status FillInterleaved(const PlanInputs& in, const PlanRequest& request,
                             const PipelinePlan& planned, int v,
                             v1::Plan* out) {
  std::vector<int> order;
  for (const StageAssignment& a : planned.stages) order.push_back(a.worker);
  const int k = static_cast<int>(order.size());
  const std::vector<int> cuts = BalancedCuts(request.layers, k * v);
  ASSIGN_OR_RETURN(std::vector<WorkerLoad> loads,
                   ChunkLoads(request, order, cuts));
  std::string text = absl::StrCat("interleaved: ", k, " workers x ", v,
                                  " chunks of equal compute; worker s holds "
                                  "chunks s, K + s, ...\n");
  for (int s = 0; s < k; ++s) {
    const v1::WorkerInfo& worker = in.workers[order[s]];
    const WorkerLoad& load = loads[s];
    if (worker.memory_bytes() > 0 &&
        load.memory_bytes > worker.memory_bytes()) {
      return absl::FailedPreconditionError(MemoryError(worker, s, load));
    }
    v1::PlannedStage* p = AddStage(worker, s, out);
    for (const v1::LayerRange& r : load.chunks) *p->add_chunks() = r;
    p->set_compute_seconds(load.compute_seconds);
    p->set_transfer_seconds(load.transfer_seconds);
    p->set_memory_bytes(static_cast<int64_t>(load.memory_bytes));
    absl::StrAppendFormat(
        &text,
        "stage %d on %s: layers %s, %.3f ms compute + %.3f ms "
        "transfer per micro-batch, %.1f MiB\n",
        s, worker.id(), RangesText(load.chunks), 1e3 * load.compute_seconds,
        1e3 * load.transfer_seconds, load.memory_bytes / kMiB);
  }
  int stage = 0;
  out->set_bottleneck_seconds(Bottleneck(loads, &stage));
  out->set_bottleneck_stage(stage);
  auto even = ChunkLoads(
      request, order, EvenCuts(static_cast<int>(request.layers.size()), k * v));
  if (even.ok()) {
    out->set_even_split_bottleneck_seconds(Bottleneck(*even, nullptr));
  }
  out->set_explanation(text);
  return absl::OkStatus();
}

std::string BandwidthText(double bytes_per_s) {
  const double bits = bytes_per_s * 8;
  return bits >= 1e9 ? absl::StrFormat("%.2f Gb/s", bits / 1e9)
                     : absl::StrFormat("%.1f Mb/s", bits / 1e6);
}

}  // namespace

std::vector<LayerWireBytes> WireBytesPerLayer(const v1::JobSpec& spec) {
  std::vector<LayerWireBytes> out;
  const absl::StatusOr<std::vector<Shape>> shapes =
      ValidateModelSpec(spec.training().model());
  if (!shapes.ok()) return out;
  const int64_t micro_batch =
      std::max<int64_t>(1, spec.training().batch_size() / MicroBatches(spec));
  const v1::WireCompression& compression = spec.wire_compression();
  for (size_t i = 1; i < shapes->size(); ++i) {
    std::vector<int64_t> shape = {micro_batch};
    shape.insert(shape.end(), (*shapes)[i].begin(), (*shapes)[i].end());
    LayerWireBytes bytes;
    bytes.activation = StreamedTensorWireBytes(shape, spec.wire_dtype(),
                                               compression.activations(),
                                               compression.group_size());
    bytes.gradient = StreamedTensorWireBytes(shape, spec.wire_dtype(),
                                             compression.gradients(),
                                             compression.group_size());
    if (bytes.activation < 0 || bytes.gradient < 0) return {};
    out.push_back(bytes);
  }
  return out;
}

void ApplyLinkOverrides(const Topology& topology,
                        std::vector<v1::WorkerInfo>* workers) {
  const auto zone = [](const v1::WorkerInfo& w) {
    auto it = w.labels().find("zone");
    return it == w.labels().end() ? std::string() : it->second;
  };
  for (v1::WorkerInfo& from : *workers) {
    for (const v1::WorkerInfo& to : *workers) {
      if (to.id() == from.id()) continue;
      const double bandwidth = topology.BandwidthOverride(zone(from), zone(to));
      const double rtt = topology.RttOverride(zone(from), zone(to));
      if (bandwidth < 0 && rtt < 0) continue;
      v1::LinkMeasurement* link = nullptr;
      for (v1::LinkMeasurement& l : *from.mutable_links()) {
        if (l.to_worker_id() == to.id()) link = &l;
      }
      if (link == nullptr) {
        link = from.add_links();
        link->set_to_worker_id(to.id());
        link->set_bandwidth_bytes_per_s(
            topology.Bandwidth(zone(from), zone(to)));
      }
      if (bandwidth >= 0) link->set_bandwidth_bytes_per_s(bandwidth);
      if (rtt >= 0) link->set_rtt_seconds(rtt);
      link->set_source("override");
    }
  }
}

int ChunksPerWorker(const v1::JobSpec& spec) {
  if (spec.schedule() != v1::SCHEDULE_INTERLEAVED) return 1;
  return spec.virtual_stages() > 0 ? spec.virtual_stages() : 2;
}

v1::ProfileRequest ProfileRequestFor(const v1::JobSpec& spec, int repetitions) {
  v1::ProfileRequest request;
  *request.mutable_spec() = spec.training();
  request.set_repetitions(repetitions);
  const absl::StatusOr<ScheduleKind> kind =
      ScheduleKindFromProto(spec.schedule());
  request.set_reuse_weights(
      kind.ok() &&
      ReusesWeights(*kind, static_cast<int>(spec.training().micro_batches())));
  return request;
}

absl::Status CheckJobSpec(const v1::JobSpec& spec, int alive_workers) {
  const int layers = spec.training().model().layers_size();
  if (spec.num_stages() < 0) {
    return absl::InvalidArgumentError("spec.num_stages: must be >= 0");
  }
  if (spec.num_stages() > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.num_stages: ", spec.num_stages(),
                     " stages for a model of ", layers, " layers"));
  }
  if (spec.num_stages() > alive_workers) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job needs ", spec.num_stages(), " workers but only ",
                     alive_workers, " are registered"));
  }
  if (spec.vertical_sync() && spec.schedule() != v1::SCHEDULE_ASYNC_1F1B) {
    return absl::InvalidArgumentError(
        "spec.vertical_sync: only applies to SCHEDULE_ASYNC_1F1B");
  }
  if (spec.schedule() != v1::SCHEDULE_INTERLEAVED) {
    if (spec.virtual_stages() > 1) {
      return absl::InvalidArgumentError(
          "spec.virtual_stages: only applies to SCHEDULE_INTERLEAVED");
    }
    return absl::OkStatus();
  }
  const int v = ChunksPerWorker(spec);
  const int k = spec.num_stages();
  if (v < 2) {
    return absl::InvalidArgumentError(
        "spec.virtual_stages: interleaving needs at least 2 chunks per worker");
  }
  if (k > 0 && (MicroBatches(spec) % k != 0 || layers < k * v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.num_stages: interleaving ", k, " workers x ", v,
                     " chunks needs micro_batches divisible by ", k,
                     " and at least ", k * v, " layers"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Plan> BuildPlan(const PlanInputs& in) {
  if (in.workers.empty()) {
    return absl::InvalidArgumentError("no workers to plan on");
  }
  const WorkerSpeeds speeds =
      SpeedsByKind(in.workers, in.profile, in.kind_profiles);
  PlanRequest request = BuildRequest(in, speeds);
  const int v = ChunksPerWorker(in.spec);
  PlanRequest search = request;
  if (v > 1) {
    // The planner picks the workers and their order for K contiguous
    // stages; memory is checked on the chunks they will really hold.
    search.num_stages =
        InterleavedStageCount(in.spec, static_cast<int>(in.workers.size()), v);
    for (PlannerWorker& w : search.workers) w.memory_bytes = 0;
  }
  ASSIGN_OR_RETURN(PipelinePlan planned, PlanPipeline(search));
  // Extra warm-up bounds the stage count: stage 0's (K - 1) (1 + extra)
  // warm-up forwards must fit in one step. A free choice above the bound is
  // planned again at it.
  if (v == 1 && in.spec.num_stages() == 0 && in.spec.extra_warmup() > 0) {
    const int max_k = MaxStagesForExtraWarmup(
        static_cast<int>(MicroBatches(in.spec)), in.spec.extra_warmup());
    if (static_cast<int>(planned.stages.size()) > max_k) {
      search.num_stages = max_k;
      ASSIGN_OR_RETURN(planned, PlanPipeline(search));
    }
  }
  std::string warmup_note;
  if (v == 1 && in.spec.extra_warmup() == kAutoExtraWarmup) {
    warmup_note = ChooseExtraWarmup(search, &request, &planned);
  }
  v1::Plan out;
  out.set_job_id(in.job_id);
  out.set_extra_warmup(request.extra_warmup);
  if (v > 1) {
    RETURN_IF_ERROR(FillInterleaved(in, request, planned, v, &out));
  } else {
    FillContiguous(in, request, planned, &out);
  }
  // The schedule sets the bubble: a step is M bottleneck micro-batches of
  // work stretched by it (GPipe: (M + K - 1) * bottleneck), unless the
  // schedule can be simulated with the links (SimulatedStep).
  const int k = out.stages_size();
  const double bubble = in.bubble ? in.bubble(k) : 0.0;
  out.set_predicted_bubble(bubble);
  out.set_predicted_step_seconds(request.micro_batches *
                                 out.bottleneck_seconds() / (1.0 - bubble));
  std::string sharing;
  const double simulated =
      v == 1 ? SimulatedStep(in.spec, request, planned.stages, &sharing) : -1;
  if (simulated > 0) {
    out.set_predicted_step_seconds(simulated);
  } else {
    out.set_predicted_step_seconds(
        out.predicted_step_seconds() +
        OptimizerSecondsPerStep(in.spec, request, planned.stages, v));
  }
  const SharedCpuBound shared =
      SharedCpuStep(in.spec, request, planned.stages, v);
  if (shared.seconds > out.predicted_step_seconds()) {
    out.set_predicted_step_seconds(shared.seconds);
  }
  std::string links;
  for (const v1::PlannedStage& p : out.stages()) {
    if (p.link_bandwidth_bytes_per_s() <= 0) continue;
    const LinkEstimate link =
        LinkBetween(request, request.workers[planned.stages[p.stage()].worker],
                    request.workers[planned.stages[p.stage() + 1].worker]);
    absl::StrAppendFormat(
        &links,
        "link %d -> %d: %s, RTT %.3f ms (%s), %d bytes per micro-batch\n",
        p.stage(), p.stage() + 1, BandwidthText(link.bandwidth_bytes_per_s),
        link.rtt_seconds * 1e3, link.source, p.wire_bytes_per_micro_batch());
  }
  if (request.message_overhead_seconds > 0) {
    absl::StrAppendFormat(
        &links, "message overhead %.3f ms per message sent or received (%s)\n",
        request.message_overhead_seconds * 1e3,
        MessageOverheadSource(in.message_overhead_seconds, in.workers));
  }
  if (request.stream_extra_seconds > 0) {
    absl::StrAppendFormat(
        &links,
        "stage stream: %.3f ms more a message than that, on the workers' "
        "own stacks (the median of their stream probes)\n",
        request.stream_extra_seconds * 1e3);
  }
  if (simulated > 0) {
    absl::StrAppendFormat(&links,
                          "the schedule simulated with these links and "
                          "message costs: a step of %.3f ms%s\n",
                          simulated * 1e3, sharing);
  }
  out.set_explanation(absl::StrCat(
      out.explanation(), "\n", links, shared.explanation, warmup_note,
      absl::StrFormat("predicted step %.3f ms",
                      out.predicted_step_seconds() * 1e3)));
  out.set_explanation(absl::StrCat("profiled on ", in.workers[0].id(), " (",
                                   in.profile.device(), ")\n",
                                   speeds.explanation, out.explanation()));
  return out;
}

}  // namespace pipetrain
