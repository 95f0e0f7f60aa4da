#include "scheduler/step_prediction.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "common/median.h"
#include "spec/job_spec.h"
#include "spec/schedule.h"
#include "spec/vocabulary.h"

namespace pipetrain {

namespace {

// The per-message overhead the planner uses, and where it comes from.
struct OverheadFigure {
  double seconds = 0;
  std::string source;
};

OverheadFigure DecideMessageOverhead(
    double configured, const std::vector<v1::WorkerInfo>& workers) {
  if (configured >= 0) return {configured, "--message_overhead_seconds"};
  // What the workers measured on their own gRPC stacks, with no network
  // in the way.
  std::vector<double> own;
  for (const v1::WorkerInfo& w : workers) {
    if (w.message_overhead_seconds() > 0) {
      own.push_back(w.message_overhead_seconds());
    }
  }
  if (!own.empty()) {
    return {Median(own),
            "the median of what the workers measured on their own gRPC "
            "stacks"};
  }
  // Else a quarter of the links' round trips: right on loopback and a LAN,
  // far too high across a WAN, where the round trip is the network's.
  std::vector<double> rtts;
  for (const v1::WorkerInfo& w : workers) {
    for (const v1::LinkMeasurement& l : w.links()) {
      if (l.source() == "probe" && l.rtt_seconds() > 0) {
        rtts.push_back(l.rtt_seconds());
      }
    }
  }
  if (rtts.empty()) return {0.0, "nothing measured yet"};
  return {Median(rtts) / 4, "a quarter of the median probe RTT"};
}

// Micro-batches whose weight-gradient products a stage holds back to run
// together (SimCosts::held_weight_grads; worker/nn/weight_grad_queue.h):
// HeldWeightGradMicroBatches of a linear layer's input rows in a
// micro-batch (its samples times each sample's rows: a token sequence's
// length, one for a feature vector). 0: none held.
int HeldWeightGradsOf(const v1::JobSpec& spec, ScheduleKind kind) {
  const v1::TrainingSpec& t = spec.training();
  const int m = static_cast<int>(std::max<int64_t>(1, t.micro_batches()));
  if (!DefersWeightGrads(kind, m, t.rematerialize())) return 0;
  const v1::ModelSpec& model = t.model();
  const int dims = model.input_shape_size();
  int64_t rows_per_sample = 1;
  for (int i = 0; i < dims; ++i) {
    if (i == dims - 1 && model.input_kind() != v1::INPUT_KIND_TOKENS) break;
    rows_per_sample *= std::max<int64_t>(1, model.input_shape(i));
  }
  const int64_t rows = t.batch_size() / m * rows_per_sample;
  return rows <= 0 ? 0 : static_cast<int>(HeldWeightGradMicroBatches(rows));
}

// Optimizer updates a stage runs in a step (its stream's kOptimizerStep
// instructions: once, or once per micro-batch under asynchronous 1F1B).
int64_t UpdatesPerStep(const v1::JobSpec& spec, int workers,
                       int chunks_per_worker) {
  int64_t updates = 1;
  const absl::StatusOr<ScheduleParams> params =
      JobScheduleParams(spec, workers);
  if (chunks_per_worker == 1 && params.ok()) {
    const absl::StatusOr<std::vector<Instruction>> stream =
        BuildSchedule(*params, 0);
    if (stream.ok()) {
      updates = std::count_if(stream->begin(), stream->end(),
                              [](const Instruction& in) {
                                return in.op == OpKind::kOptimizerStep;
                              });
    }
  }
  return updates;
}

// A stage's profiled layer costs summed over its layers, on its worker
// (divided by the worker's speed).
struct StageWork {
  double forward = 0;
  double backward = 0;
  double optimizer = 0;
};

StageWork WorkOf(const PlanRequest& request, const StageAssignment& stage) {
  const double speed = request.workers[stage.worker].speed;
  StageWork work;
  for (int l = stage.layer_begin; l < stage.layer_end; ++l) {
    work.forward += request.layers[l].forward_seconds / speed;
    work.backward += request.layers[l].backward_seconds / speed;
    work.optimizer += request.layers[l].optimizer_seconds / speed;
  }
  return work;
}

// The CPU one end of a message of `bytes` on the wire takes.
double MessageEndCpu(const PlanRequest& request, int64_t bytes) {
  return request.message_cpu_seconds +
         static_cast<double>(bytes) * request.message_cpu_seconds_per_byte;
}

// The machines the stages' workers run on (PlannerWorker::host_id and
// host_cpus; a worker with no id or no CPU count is on a machine of its
// own, -1), for SimulatedStep and SharedCpuStep; false when none is known.
// `ids` (when given) gets each machine's id. A message end takes the CPU
// the workers measured beyond the overhead a stage's passes already charge
// it.
bool MachinesOf(const PlanRequest& request,
                const std::vector<StageAssignment>& stages,
                SimMachines* machines,
                std::vector<std::string>* ids = nullptr) {
  std::map<std::string, int> index;
  for (const StageAssignment& stage : stages) {
    const PlannerWorker& w = request.workers[stage.worker];
    if (w.host_id.empty() || w.host_cpus <= 0) {
      machines->machine_of.push_back(-1);
      continue;
    }
    auto [it, added] =
        index.emplace(w.host_id, static_cast<int>(machines->cpus.size()));
    if (added) {
      machines->cpus.push_back(w.host_cpus);
      if (ids != nullptr) ids->push_back(w.host_id);
    }
    machines->machine_of.push_back(it->second);
  }
  machines->message_cpu = std::max(
      0.0, request.message_cpu_seconds - request.message_overhead_seconds);
  return !index.empty();
}

int DistinctWorkers(const std::vector<StageAssignment>& stages) {
  std::set<int> workers;
  for (const StageAssignment& stage : stages) workers.insert(stage.worker);
  return static_cast<int>(workers.size());
}

}  // namespace

double MessageCpu(double overhead_seconds,
                  const std::vector<v1::WorkerInfo>& workers) {
  std::vector<double> cpu;
  for (const v1::WorkerInfo& w : workers) {
    if (w.message_cpu_seconds() > 0) cpu.push_back(w.message_cpu_seconds());
  }
  // Unmeasured: at least the stage's own wait.
  return cpu.empty() ? overhead_seconds : Median(cpu);
}

double MessageCpuPerByte(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<double> per_byte;
  for (const v1::WorkerInfo& w : workers) {
    if (w.message_cpu_seconds_per_byte() > 0 &&
        std::isfinite(w.message_cpu_seconds_per_byte())) {
      per_byte.push_back(w.message_cpu_seconds_per_byte());
    }
  }
  return per_byte.empty() ? 0.0 : Median(per_byte);
}

double StreamExtraLatency(double configured,
                          const std::vector<v1::WorkerInfo>& workers) {
  if (configured >= 0) return 0;
  std::vector<double> extra;
  for (const v1::WorkerInfo& w : workers) {
    if (w.stream_hop_seconds() > 0 && std::isfinite(w.stream_hop_seconds()) &&
        w.message_overhead_seconds() > 0) {
      extra.push_back(std::max(
          0.0, w.stream_hop_seconds() - 4 * w.message_overhead_seconds()));
    }
  }
  return extra.empty() ? 0.0 : Median(extra);
}

std::string MessageOverheadSource(double configured,
                                  const std::vector<v1::WorkerInfo>& workers) {
  return DecideMessageOverhead(configured, workers).source;
}

double MessageOverhead(double configured,
                       const std::vector<v1::WorkerInfo>& workers) {
  return DecideMessageOverhead(configured, workers).seconds;
}

double OptimizerSecondsPerStep(const v1::JobSpec& spec,
                               const PlanRequest& request,
                               const std::vector<StageAssignment>& stages,
                               int chunks_per_worker) {
  std::map<int, double> per_worker;
  for (const StageAssignment& stage : stages) {
    per_worker[stage.worker] += WorkOf(request, stage).optimizer;
  }
  const int64_t updates = UpdatesPerStep(
      spec, static_cast<int>(per_worker.size()), chunks_per_worker);
  double worst = 0;
  for (const auto& [worker, seconds] : per_worker) {
    worst = std::max(worst, seconds);
  }
  return static_cast<double>(updates) * worst;
}

double SimulatedStep(const v1::JobSpec& spec, const PlanRequest& request,
                     const std::vector<StageAssignment>& stages,
                     std::string* note) {
  if (note != nullptr) note->clear();
  absl::StatusOr<ScheduleKind> kind = ScheduleKindFromProto(spec.schedule());
  if (!kind.ok() ||
      !(*kind == ScheduleKind::kGPipe ||
        *kind == ScheduleKind::kOneFOneBFlush ||
        *kind == ScheduleKind::kZeroBubbleH1 || IsCrossStep(*kind))) {
    return -1;
  }
  const int k = static_cast<int>(stages.size());
  const double o = request.message_overhead_seconds;
  const int held_weight_grads = HeldWeightGradsOf(spec, *kind);
  std::vector<SimCosts> costs(k);
  std::vector<LinkEstimate> down(k);  // link s -> s + 1
  std::vector<LinkEstimate> up(k);    // link s -> s - 1
  for (int s = 0; s < k; ++s) {
    if (s + 1 < k) {
      down[s] = LinkBetween(request, request.workers[stages[s].worker],
                            request.workers[stages[s + 1].worker]);
    }
    if (s > 0) {
      up[s] = LinkBetween(request, request.workers[stages[s].worker],
                          request.workers[stages[s - 1].worker]);
    }
  }
  for (int s = 0; s < k; ++s) {
    const StageAssignment& a = stages[s];
    const StageWork work = WorkOf(request, a);
    SimCosts& c = costs[s];
    c.forward = work.forward;
    c.backward = work.backward;
    c.optimizer = work.optimizer;
    c.weight_grad = work.backward / 2;  // the messages' overhead is B's
    c.held_weight_grads = held_weight_grads;
    const int neighbours = (s > 0) + (s + 1 < k);
    c.forward += o * neighbours;
    c.backward += o * neighbours;
    if (s + 1 < k) {
      const int64_t bytes = request.layers[a.layer_end - 1].ActivationOnWire();
      c.activation_transfer =
          static_cast<double>(bytes) / down[s].bandwidth_bytes_per_s;
      c.activation_message_cpu =
          std::max(0.0, MessageEndCpu(request, bytes) - o);
      c.send = 0.25 * (down[s].rtt_seconds + up[s + 1].rtt_seconds) +
               request.stream_extra_seconds;
    }
    if (s > 0) {
      const int64_t bytes = request.layers[a.layer_begin - 1].GradientOnWire();
      c.gradient_transfer =
          static_cast<double>(bytes) / up[s].bandwidth_bytes_per_s;
      c.gradient_message_cpu = std::max(0.0, MessageEndCpu(request, bytes) - o);
      c.gradient_send = 0.25 * (up[s].rtt_seconds + down[s - 1].rtt_seconds) +
                        request.stream_extra_seconds;
    }
  }
  SimMachines machines;
  const SimMachines* shared =
      MachinesOf(request, stages, &machines) ? &machines : nullptr;
  if (shared != nullptr && note != nullptr) {
    *note = absl::StrFormat(
        " (the stages and their messages sharing their machines' CPUs, "
        "%.3f ms of CPU a message end beyond its stage's",
        machines.message_cpu * 1e3);
    if (request.message_cpu_seconds_per_byte > 0) {
      absl::StrAppendFormat(&*note, " and %.3f ms per MB of payload",
                            request.message_cpu_seconds_per_byte * 1e9);
    }
    *note += ")";
  }
  ScheduleParams params;
  params.kind = *kind;
  params.num_stages = k;
  params.micro_batches = request.micro_batches;
  if (IsCrossStep(*kind)) {
    // No flush: the steady step, the difference between runs of
    // kSteadySteps + 2 and 2 steps, per step (the first warms up, the
    // last cools down).
    constexpr int kSteadySteps = 4;
    params.extra_warmup = request.extra_warmup;
    const SimResult longer =
        SimulateSteps(params, kSteadySteps + 2, SimCosts{}, costs, shared);
    const SimResult shorter =
        SimulateSteps(params, 2, SimCosts{}, costs, shared);
    if (!longer.status.ok() || longer.deadlock || !shorter.status.ok() ||
        shorter.deadlock) {
      return -1;
    }
    return (longer.makespan - shorter.makespan) / kSteadySteps;
  }
  const SimResult result = Simulate(params, SimCosts{}, costs, shared);
  if (!result.status.ok() || result.deadlock) return -1;
  return result.makespan;
}

SharedCpuBound SharedCpuStep(const v1::JobSpec& spec,
                             const PlanRequest& request,
                             const std::vector<StageAssignment>& stages,
                             int chunks_per_worker) {
  struct Machine {
    int cpus = 0;
    int stages = 0;
    double passes = 0;
    double updates = 0;
    int64_t message_ends = 0;
    double messages = 0;  // their CPU
  };
  const double m = request.micro_batches;
  const int64_t updates =
      UpdatesPerStep(spec, DistinctWorkers(stages), chunks_per_worker);
  const int n = static_cast<int>(stages.size());
  SimMachines known;
  std::vector<std::string> ids;
  MachinesOf(request, stages, &known, &ids);
  // By id, so that the explanation lists the machines in one order.
  std::map<std::string, Machine> machines;
  for (int s = 0; s < n; ++s) {
    const int index = known.machine_of[s];
    if (index < 0) continue;
    Machine& machine = machines[ids[index]];
    machine.cpus = known.cpus[index];
    ++machine.stages;
    const StageWork work = WorkOf(request, stages[s]);
    machine.passes += m * (work.forward + work.backward);
    machine.updates += updates * work.optimizer;
    const int neighbours = (s > 0) + (s + 1 < n);
    // Each micro-batch's activation and gradient, sent and received, on
    // each side with a neighbour.
    machine.message_ends += static_cast<int64_t>(m) * 2 * neighbours;
    // A side's ends: the activation and the gradient across its cut.
    const auto side = [&](int last) {
      const LayerCost& cut = request.layers[last];
      return m * (MessageEndCpu(request, cut.ActivationOnWire()) +
                  MessageEndCpu(request, cut.GradientOnWire()));
    };
    if (s > 0) machine.messages += side(stages[s].layer_begin - 1);
    if (s + 1 < n) machine.messages += side(stages[s].layer_end - 1);
  }
  SharedCpuBound out;
  for (const auto& [id, machine] : machines) {
    const double cpu = machine.passes + machine.updates + machine.messages;
    const double floor = cpu / machine.cpus;
    out.seconds = std::max(out.seconds, floor);
    if (machine.stages < 2) continue;
    absl::StrAppendFormat(
        &out.explanation,
        "machine %s: %d stages on %d CPUs spend %.3f ms of CPU a step "
        "(passes %.3f, updates %.3f, %d message ends %.3f): a step takes "
        "at least %.3f ms\n",
        id.substr(0, 8), machine.stages, machine.cpus, cpu * 1e3,
        machine.passes * 1e3, machine.updates * 1e3, machine.message_ends,
        machine.messages * 1e3, floor * 1e3);
  }
  return out;
}

}  // namespace pipetrain
