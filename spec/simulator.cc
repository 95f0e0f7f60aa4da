// Discrete-event simulation of a set of instruction streams.
//
// Each stage runs its stream strictly in order on one clock. Sends are
// asynchronous: they take no stage time and the message arrives
// `send` later. A receive waits for its message. Because a stage's
// instructions only depend on its own clock and on arrival times, the
// stages can be advanced one at a time as far as their messages allow;
// the result equals an event-ordered run. When no stage can advance and
// some are unfinished, the streams deadlock.
//
// On shared machines (SimMachines) a stage's progress depends on what else
// runs on its machine at the same time, so the run is event-ordered
// instead: time moves to the next end of a pass, of a message's CPU or of
// its latency, with every runnable stage and message advancing at its
// machine's share meanwhile.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/schedule.h"

namespace pipetrain {
namespace {

constexpr int64_t kMaxMailboxSlots = int64_t{1} << 22;
constexpr double kNotSent = -1.0;

// Per-stage progress; owned by PipelineSim.
struct StageState {
  size_t pc = 0;
  double clock = 0.0;
  double busy = 0.0;
  int in_flight = 0;  // F ran, B (or full backward) not finished
  int held = 0;       // F ran, W (or full backward) not finished
  int peak_in_flight = 0;
  int peak_held = 0;
  // Micro-batches whose weight-gradient products are held back
  // (SimCosts::held_weight_grads).
  int held_weight_grads = 0;
};

bool IsSend(OpKind op) {
  return op == OpKind::kSendActivation || op == OpKind::kSendGradient;
}
bool IsRecv(OpKind op) {
  return op == OpKind::kRecvActivation || op == OpKind::kRecvGradient;
}
bool IsGradientMessage(OpKind op) {
  return op == OpKind::kSendGradient || op == OpKind::kRecvGradient;
}

absl::Status ValidateCosts(const std::vector<SimCosts>& costs, size_t k) {
  if (costs.size() != k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need one SimCosts per stage: ", k, " stages, ", costs.size()));
  }
  for (const SimCosts& c : costs) {
    for (double x :
         {c.forward, c.backward, c.send, c.optimizer, c.activation_transfer,
          c.gradient_transfer, std::max(c.gradient_send, 0.0),
          std::max(c.weight_grad, 0.0),
          static_cast<double>(c.held_weight_grads),
          std::max(c.activation_message_cpu, 0.0),
          std::max(c.gradient_message_cpu, 0.0)}) {
      if (!(x >= 0.0) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat("costs must be finite and >= 0, got ", x));
      }
    }
  }
  return absl::OkStatus();
}

// Runs one set of streams. Not thread-safe; used within one call.
class PipelineSim {
 public:
  PipelineSim(const std::vector<std::vector<Instruction>>& streams,
              int virtual_stages, const std::vector<SimCosts>& costs)
      : streams_(streams),
        costs_(costs),
        num_stages_(static_cast<int>(streams.size())),
        chunks_(virtual_stages),
        stages_(streams.size()),
        link_free_(2 * streams.size(), 0.0) {}

  absl::Status Validate();
  absl::Status CheckSendsAreUnique();
  SimResult Run(const SimMachines* machines);

 private:
  // The virtual stage a message from / to `in` on stage s goes to / comes
  // from.
  int VirtualStage(int stage, const Instruction& in) const {
    return in.chunk * num_stages_ + stage;
  }
  int Peer(int stage, const Instruction& in) const;
  double& Mailbox(bool gradient, int virtual_stage, int m) {
    return (gradient ? gradients_ : activations_)[static_cast<size_t>(
        virtual_stage * micro_batches_ + m)];
  }
  absl::Status ValidateInstruction(int stage, const Instruction& in);
  double Duration(const Instruction& in, const SimCosts& c) const;
  double HeldWeightGrads(StageState& st, const Instruction& in,
                         const SimCosts& c) const;
  // Runs stage s's next instruction; false when it waits for a message.
  bool TryStep(int s);
  // A send by stage s at `at`: takes its link (queued behind the link's
  // last message) and returns when its latency has passed.
  double SendReady(int s, const Instruction& in, double at);
  void Account(StageState& st, OpKind op);
  std::string BlockedDetail() const;
  // Runs every stream to its end (or a deadlock) on shared machines.
  absl::Status RunShared(const SimMachines& machines);
  SimResult Result();

  // Constant after construction.
  const std::vector<std::vector<Instruction>>& streams_;
  const std::vector<SimCosts>& costs_;
  const int num_stages_;
  const int chunks_;
  // Set by Validate.
  int micro_batches_ = 0;
  // Mutable run state: arrival time per (virtual stage, micro-batch).
  std::vector<double> activations_;
  std::vector<double> gradients_;
  std::vector<StageState> stages_;
  // When each stage's outgoing links are free again: [2 * s] activations,
  // [2 * s + 1] gradients.
  std::vector<double> link_free_;
};

// Message peer: activations go to the next virtual stage and come from the
// previous one; gradients the reverse. -1 or V when outside the pipeline.
int PipelineSim::Peer(int stage, const Instruction& in) const {
  const int j = VirtualStage(stage, in);
  const bool toward_next =
      in.op == OpKind::kSendActivation || in.op == OpKind::kRecvGradient;
  return toward_next ? j + 1 : j - 1;
}

absl::Status PipelineSim::ValidateInstruction(int stage,
                                              const Instruction& in) {
  if (in.micro_batch < 0 || in.micro_batch >= kMaxMailboxSlots ||
      in.chunk < 0 || in.chunk >= chunks_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", stage, ": bad micro-batch or chunk in ", ToString(in)));
  }
  const int peer = Peer(stage, in);
  if ((IsSend(in.op) || IsRecv(in.op)) &&
      (peer < 0 || peer >= num_stages_ * chunks_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", stage, ": ", ToString(in), " has no peer virtual stage"));
  }
  micro_batches_ = std::max(micro_batches_, in.micro_batch + 1);
  return absl::OkStatus();
}

absl::Status PipelineSim::Validate() {
  if (num_stages_ < 1 || chunks_ < 1 ||
      int64_t{num_stages_} * chunks_ > kMaxMailboxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 1 to ", kMaxMailboxSlots, " virtual stages, got ",
                     num_stages_, " streams of ", chunks_, " chunks"));
  }
  RETURN_IF_ERROR(ValidateCosts(costs_, streams_.size()));
  for (int s = 0; s < num_stages_; ++s) {
    for (const Instruction& in : streams_[s]) {
      RETURN_IF_ERROR(ValidateInstruction(s, in));
    }
  }
  const int64_t slots =
      int64_t{num_stages_} * chunks_ * int64_t{micro_batches_};
  if (slots > kMaxMailboxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams too large to simulate: ", slots, " slots"));
  }
  activations_.assign(static_cast<size_t>(slots), kNotSent);
  gradients_.assign(static_cast<size_t>(slots), kNotSent);
  return CheckSendsAreUnique();
}

// A message sent twice would make its receive ambiguous. Marks the
// mailboxes while checking and clears them again.
absl::Status PipelineSim::CheckSendsAreUnique() {
  absl::Status status = absl::OkStatus();
  for (int s = 0; s < num_stages_ && status.ok(); ++s) {
    for (const Instruction& in : streams_[s]) {
      if (!IsSend(in.op)) continue;
      double& slot =
          Mailbox(IsGradientMessage(in.op), Peer(s, in), in.micro_batch);
      if (slot != kNotSent) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "stage ", s, " sends ", ToString(in), " more than once"));
        break;
      }
      slot = 0.0;
    }
  }
  std::fill(activations_.begin(), activations_.end(), kNotSent);
  std::fill(gradients_.begin(), gradients_.end(), kNotSent);
  return status;
}

double WeightGrad(const SimCosts& c) {
  return c.weight_grad >= 0.0 ? std::min(c.weight_grad, c.backward)
                              : c.backward / 2.0;
}

// Compute costs; a chunk of an interleaved stage does 1/v of its work.
// kLoss is folded into the forward and kLoadInput is free.
double PipelineSim::Duration(const Instruction& in, const SimCosts& c) const {
  switch (in.op) {
    case OpKind::kForward:
      return c.forward / chunks_;
    case OpKind::kBackward:
      return c.backward / chunks_;
    case OpKind::kBackwardInput:
      return (c.backward - WeightGrad(c)) / chunks_;
    case OpKind::kBackwardWeight:
      return WeightGrad(c) / chunks_;
    case OpKind::kOptimizerStep:
      return c.optimizer;
    default:
      return 0.0;
  }
}

// What holding weight-gradient products back changes in an instruction's
// duration: a W half moves from its pass to the pass that runs the held
// products together (the one that would hold one too many, or the
// optimizer step).
double PipelineSim::HeldWeightGrads(StageState& st, const Instruction& in,
                                    const SimCosts& c) const {
  if (c.held_weight_grads <= 0) return 0.0;
  const double w = WeightGrad(c) / chunks_;
  if (in.op == OpKind::kOptimizerStep) {
    const double flushed = st.held_weight_grads * w;
    st.held_weight_grads = 0;
    return flushed;
  }
  if (in.op != OpKind::kBackward && in.op != OpKind::kBackwardWeight) {
    return 0.0;
  }
  double change = -w;
  if (st.held_weight_grads >= c.held_weight_grads * chunks_) {
    change += st.held_weight_grads * w;
    st.held_weight_grads = 0;
  }
  ++st.held_weight_grads;
  return change;
}

void PipelineSim::Account(StageState& st, OpKind op) {
  switch (op) {
    case OpKind::kForward:
      st.peak_in_flight = std::max(st.peak_in_flight, ++st.in_flight);
      st.peak_held = std::max(st.peak_held, ++st.held);
      break;
    case OpKind::kBackward:
      --st.in_flight;
      --st.held;
      break;
    case OpKind::kBackwardInput:
      --st.in_flight;
      break;
    case OpKind::kBackwardWeight:
      --st.held;
      break;
    default:
      break;
  }
}

bool PipelineSim::TryStep(int s) {
  StageState& st = stages_[s];
  const Instruction& in = streams_[s][st.pc];
  double start = st.clock;
  if (IsRecv(in.op)) {
    const double arrival =
        Mailbox(IsGradientMessage(in.op), VirtualStage(s, in), in.micro_batch);
    if (arrival == kNotSent) return false;
    start = std::max(start, arrival);
  }
  const double duration =
      Duration(in, costs_[s]) + HeldWeightGrads(st, in, costs_[s]);
  st.clock = start + duration;
  st.busy += duration;
  if (IsSend(in.op)) {
    Mailbox(IsGradientMessage(in.op), Peer(s, in), in.micro_batch) =
        SendReady(s, in, st.clock);
  }
  Account(st, in.op);
  ++st.pc;
  return true;
}

double PipelineSim::SendReady(int s, const Instruction& in, double at) {
  const SimCosts& c = costs_[s];
  const bool gradient = IsGradientMessage(in.op);
  double& free_at = link_free_[2 * s + (gradient ? 1 : 0)];
  free_at = std::max(at, free_at) +
            (gradient ? c.gradient_transfer : c.activation_transfer);
  const double latency =
      gradient && c.gradient_send >= 0.0 ? c.gradient_send : c.send;
  return free_at + latency;
}

namespace {

absl::Status ValidateMachines(const SimMachines& machines, int num_stages) {
  if (static_cast<int>(machines.machine_of.size()) != num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("need a machine for each of the ", num_stages,
                     " stages, got ", machines.machine_of.size()));
  }
  for (int machine : machines.machine_of) {
    if (machine < -1 || machine >= static_cast<int>(machines.cpus.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no machine ", machine, " (", machines.cpus.size(), " machines)"));
    }
  }
  for (int cpus : machines.cpus) {
    if (cpus < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a machine needs at least 1 CPU, got ", cpus));
    }
  }
  if (!(machines.message_cpu >= 0.0) || !std::isfinite(machines.message_cpu)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message_cpu must be finite and >= 0, got ", machines.message_cpu));
  }
  return absl::OkStatus();
}

// A stage's pass in progress on a shared machine.
struct SharedPass {
  bool running = false;
  double length = 0.0;     // at full speed
  double remaining = 0.0;  // of `length`
  double started = 0.0;
};

// A message on its way: its sender's end, then its receiver's, take CPU
// on their machines; it arrives once both are done and `ready` has come.
struct SharedMessage {
  bool gradient = false;
  int to = 0;  // virtual stage
  int micro_batch = 0;
  int machine[2] = {-1, -1};
  int end = 0;       // 0, 1: whose CPU it takes now; 2: its CPU is done
  double cpu = 0.0;  // at each end
  double remaining = 0.0;
  double ready = 0.0;
};

}  // namespace

absl::Status PipelineSim::RunShared(const SimMachines& machines) {
  RETURN_IF_ERROR(ValidateMachines(machines, num_stages_));
  std::vector<SharedPass> passes(num_stages_);
  std::vector<SharedMessage> messages;
  // Skips the ends that take no CPU (no message CPU, or a machine of its
  // own, which has one free).
  auto settle = [](SharedMessage& msg) {
    while (msg.end < 2 && (msg.cpu <= 0.0 || msg.machine[msg.end] < 0)) {
      ++msg.end;
    }
    msg.remaining = msg.end < 2 ? msg.cpu : 0.0;
  };
  double now = 0.0;
  while (true) {
    // Start everything that can start now: passes, sends, and receives of
    // messages that have arrived.
    for (int s = 0; s < num_stages_; ++s) {
      StageState& st = stages_[s];
      while (!passes[s].running && st.pc < streams_[s].size()) {
        const Instruction& in = streams_[s][st.pc];
        if (IsRecv(in.op) &&
            Mailbox(IsGradientMessage(in.op), VirtualStage(s, in),
                    in.micro_batch) == kNotSent) {
          break;
        }
        st.clock = now;
        const double duration =
            Duration(in, costs_[s]) + HeldWeightGrads(st, in, costs_[s]);
        if (IsSend(in.op)) {
          SharedMessage msg;
          msg.gradient = IsGradientMessage(in.op);
          msg.to = Peer(s, in);
          msg.micro_batch = in.micro_batch;
          msg.machine[0] = machines.machine_of[s];
          msg.machine[1] = machines.machine_of[msg.to % num_stages_];
          const double own = msg.gradient ? costs_[s].gradient_message_cpu
                                          : costs_[s].activation_message_cpu;
          msg.cpu = own >= 0.0 ? own : machines.message_cpu;
          msg.ready = SendReady(s, in, now);
          settle(msg);
          messages.push_back(msg);
        }
        if (duration > 0.0) {
          passes[s] = {true, duration, duration, now};
          break;
        }
        Account(st, in.op);
        ++st.pc;
      }
    }
    // Each machine's share: its CPUs over what runs on it.
    std::vector<int> load(machines.cpus.size(), 0);
    for (int s = 0; s < num_stages_; ++s) {
      const int machine = machines.machine_of[s];
      if (passes[s].running && machine >= 0) ++load[machine];
    }
    for (const SharedMessage& msg : messages) {
      if (msg.end < 2) ++load[msg.machine[msg.end]];
    }
    auto rate = [&](int machine) {
      return machine < 0
                 ? 1.0
                 : std::min(1.0, static_cast<double>(machines.cpus[machine]) /
                                     load[machine]);
    };
    // When each pass and message end would finish at the present shares;
    // the next event is the first of these, or of the latencies.
    auto finish = [&](double remaining, int machine) {
      return now + remaining / rate(machine);
    };
    double next = std::numeric_limits<double>::infinity();
    for (int s = 0; s < num_stages_; ++s) {
      if (passes[s].running) {
        next =
            std::min(next, finish(passes[s].remaining, machines.machine_of[s]));
      }
    }
    for (const SharedMessage& msg : messages) {
      next = std::min(next, msg.end < 2
                                ? finish(msg.remaining, msg.machine[msg.end])
                                : std::max(now, msg.ready));
    }
    if (!std::isfinite(next)) break;  // finished, or deadlocked
    // What finishes by `next` is done, whatever rounding leaves of it (so
    // time always moves on); the rest advances at its share.
    const double elapsed = next - now;
    for (int s = 0; s < num_stages_; ++s) {
      SharedPass& pass = passes[s];
      if (!pass.running) continue;
      const int machine = machines.machine_of[s];
      if (finish(pass.remaining, machine) > next) {
        pass.remaining -= elapsed * rate(machine);
        continue;
      }
      StageState& st = stages_[s];
      const Instruction& in = streams_[s][st.pc];
      pass.running = false;
      st.busy += next - pass.started;
      st.clock = next;
      Account(st, in.op);
      ++st.pc;
    }
    for (SharedMessage& msg : messages) {
      if (msg.end == 2) continue;
      if (finish(msg.remaining, msg.machine[msg.end]) > next) {
        msg.remaining -= elapsed * rate(msg.machine[msg.end]);
        continue;
      }
      ++msg.end;
      settle(msg);
    }
    now = next;
    for (auto it = messages.begin(); it != messages.end();) {
      if (it->end == 2 && it->ready <= now) {
        Mailbox(it->gradient, it->to, it->micro_batch) = now;
        it = messages.erase(it);
      } else {
        ++it;
      }
    }
  }
  return absl::OkStatus();
}

std::string PipelineSim::BlockedDetail() const {
  std::string detail;
  for (int s = 0; s < num_stages_; ++s) {
    const StageState& st = stages_[s];
    if (st.pc >= streams_[s].size()) continue;
    const Instruction& in = streams_[s][st.pc];
    const int peer = Peer(s, in);
    absl::StrAppend(&detail, detail.empty() ? "" : "; ", "stage ", s,
                    " blocked at ", ToString(in), " (#", st.pc, ")",
                    " waiting for stage ", peer % num_stages_, " chunk ",
                    peer / num_stages_);
  }
  return detail;
}

SimResult PipelineSim::Run(const SimMachines* machines) {
  SimResult result;
  result.status = Validate();
  if (!result.status.ok()) return result;
  if (machines != nullptr) {
    result.status = RunShared(*machines);
    if (!result.status.ok()) return result;
    return Result();
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < num_stages_; ++s) {
      while (stages_[s].pc < streams_[s].size() && TryStep(s)) {
        progress = true;
      }
    }
  }
  return Result();
}

SimResult PipelineSim::Result() {
  SimResult result;
  result.deadlock_detail = BlockedDetail();
  result.deadlock = !result.deadlock_detail.empty();
  for (const StageState& st : stages_) {
    result.makespan = std::max(result.makespan, st.clock);
  }
  for (const StageState& st : stages_) {
    const double idle =
        result.makespan > 0 ? 1.0 - st.busy / result.makespan : 0.0;
    result.busy.push_back(st.busy);
    result.idle_fraction.push_back(idle);
    result.peak_in_flight.push_back(st.peak_in_flight);
    result.peak_held_until_weight_grad.push_back(st.peak_held);
    result.bubble += idle / num_stages_;
  }
  return result;
}

}  // namespace

SimResult SimulateStreams(const std::vector<std::vector<Instruction>>& streams,
                          int virtual_stages,
                          const std::vector<SimCosts>& per_stage,
                          const SimMachines* machines) {
  PipelineSim sim(streams, virtual_stages, per_stage);
  return sim.Run(machines);
}

SimResult Simulate(const ScheduleParams& params, const SimCosts& costs,
                   const std::vector<SimCosts>& per_stage,
                   const SimMachines* machines) {
  std::vector<std::vector<Instruction>> streams;
  for (int s = 0; s < std::max(params.num_stages, 1); ++s) {
    absl::StatusOr<std::vector<Instruction>> stream = BuildSchedule(params, s);
    if (!stream.ok()) {
      SimResult result;
      result.status = stream.status();
      return result;
    }
    streams.push_back(*std::move(stream));
  }
  const std::vector<SimCosts> uniform(streams.size(), costs);
  return SimulateStreams(streams, params.virtual_stages,
                         per_stage.empty() ? uniform : per_stage, machines);
}

SimResult SimulateSteps(const ScheduleParams& params, int num_steps,
                        const SimCosts& costs,
                        const std::vector<SimCosts>& per_stage,
                        const SimMachines* machines) {
  SimResult result;
  if (num_steps < 1) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat("num_steps must be >= 1, got ", num_steps));
    return result;
  }
  const bool cross = IsCrossStep(params.kind);
  std::vector<std::vector<Instruction>> streams(
      static_cast<size_t>(std::max(params.num_stages, 1)));
  for (int s = 0; s < static_cast<int>(streams.size()); ++s) {
    for (int t = 0; t < num_steps; ++t) {
      ScheduleParams step = params;
      if (cross) {
        step.steps_before = t;
        step.last_step = t == num_steps - 1;
      }
      absl::StatusOr<std::vector<Instruction>> stream = BuildSchedule(step, s);
      if (!stream.ok()) {
        result.status = stream.status();
        return result;
      }
      // One mailbox slot per micro-batch of the whole run.
      for (Instruction in : *stream) {
        in.micro_batch += (t + in.step_offset) * params.micro_batches;
        in.step_offset = 0;
        streams[s].push_back(in);
      }
    }
  }
  if (!per_stage.empty() && per_stage.size() != streams.size()) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat("per_stage has ", per_stage.size(), " costs for ",
                     streams.size(), " stages"));
    return result;
  }
  return SimulateStreams(streams, params.virtual_stages,
                         per_stage.empty()
                             ? std::vector<SimCosts>(streams.size(), costs)
                             : per_stage,
                         machines);
}

}  // namespace pipetrain
