// Instruction streams of the pipeline schedules and their theoretical
// bubbles. The simulator that checks them lives in simulator.cc.
#include "spec/schedule.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// Bound on K * v * M so a bad job spec cannot ask for gigabytes of
// instructions (the simulator keeps one mailbox slot per chunk-op).
constexpr int64_t kMaxStageChunkMicroBatches = int64_t{1} << 22;

absl::Status ValidateVirtualStages(const ScheduleParams& p) {
  if (p.kind != ScheduleKind::kInterleaved) {
    if (p.virtual_stages != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("virtual_stages must be 1 for ",
                       ScheduleKindName(p.kind), ", got ", p.virtual_stages));
    }
    return absl::OkStatus();
  }
  // v = 1 would only double 1F1B's warm-up; that schedule is 1f1b-flush.
  if (p.virtual_stages < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved needs virtual_stages >= 2 (use 1f1b-flush "
                     "for one chunk), got ",
                     p.virtual_stages));
  }
  // Megatron's ordering walks micro-batches in groups of K per chunk.
  if (p.micro_batches % p.num_stages != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved needs micro_batches (", p.micro_batches,
                     ") divisible by num_stages (", p.num_stages, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateParams(const ScheduleParams& p) {
  switch (p.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneBFlush:
    case ScheduleKind::kInterleaved:
    case ScheduleKind::kZeroBubbleH1:
    case ScheduleKind::kOneFOneBAsync:
    case ScheduleKind::kTwoBW:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown schedule kind ", static_cast<int>(p.kind)));
  }
  if (p.num_stages < 1 || p.micro_batches < 1 || p.virtual_stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_stages, micro_batches and virtual_stages must be >= 1, got ",
        p.num_stages, ", ", p.micro_batches, ", ", p.virtual_stages));
  }
  const int64_t size =
      int64_t{p.num_stages} * p.virtual_stages * int64_t{p.micro_batches};
  if (size > kMaxStageChunkMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages * virtual_stages * micro_batches = ", size,
                     " exceeds ", kMaxStageChunkMicroBatches));
  }
  if (!IsCrossStep(p.kind) && (p.steps_before != 0 || !p.last_step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ScheduleKindName(p.kind),
        " drains every step: steps_before must be 0 and last_step true"));
  }
  if (p.steps_before < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps_before must be >= 0, got ", p.steps_before));
  }
  // With M < K - 1 stage 0's update of step t would land two steps later,
  // and step t + 2 could not use it: more than two versions.
  if (p.kind == ScheduleKind::kTwoBW && p.micro_batches < p.num_stages - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("2bw needs micro_batches (", p.micro_batches,
                     ") >= num_stages - 1 (", p.num_stages - 1, ")"));
  }
  if (p.extra_warmup < 0 || p.extra_warmup > kMaxExtraWarmup) {
    return absl::InvalidArgumentError(
        absl::StrCat("extra_warmup must be in [0, ", kMaxExtraWarmup, "], got ",
                     p.extra_warmup));
  }
  if (p.extra_warmup > 0 && !IsCrossStep(p.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extra_warmup: only the cross-step schedules (1f1b-async, 2bw) keep "
        "more micro-batches in flight; ",
        ScheduleKindName(p.kind), " drains every step"));
  }
  if (p.extra_warmup > 0 && CrossStepWarmup(p, 0) > p.micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extra_warmup ", p.extra_warmup, " warms stage 0 up with ",
        CrossStepWarmup(p, 0), " forwards, more than micro_batches (",
        p.micro_batches,
        "): a stream would reach back more than one step (and 2bw would "
        "need a third weight version)"));
  }
  return ValidateVirtualStages(p);
}

// Appends one stage's instructions. Knows whether a chunk is the first or
// last virtual stage, where kLoadInput / kLoss replace the receive / send.
class StreamWriter {
 public:
  StreamWriter(int num_stages, int stage, int virtual_stages)
      : num_stages_(num_stages), stage_(stage), chunks_(virtual_stages) {}

  void Forward(int m, int chunk = 0) {
    Add(IsFirst(chunk) ? OpKind::kLoadInput : OpKind::kRecvActivation, m,
        chunk);
    Add(OpKind::kForward, m, chunk);
    Add(IsLast(chunk) ? OpKind::kLoss : OpKind::kSendActivation, m, chunk);
  }
  // The full backward, or with `split` only its input half (B); the weight
  // half (W) is then written separately by BackwardWeight.
  void Backward(int m, int chunk = 0, bool split = false) {
    if (!IsLast(chunk)) Add(OpKind::kRecvGradient, m, chunk);
    Add(split ? OpKind::kBackwardInput : OpKind::kBackward, m, chunk);
    if (!IsFirst(chunk)) Add(OpKind::kSendGradient, m, chunk);
  }
  void BackwardWeight(int m) { Add(OpKind::kBackwardWeight, m, 0); }
  // An optimizer step right after micro-batch m's backward.
  void Step(int m) { Add(OpKind::kOptimizerStep, m, 0); }
  // The step the next instructions' micro-batch belongs to (relative).
  void set_step_offset(int offset) { step_offset_ = offset; }

  std::vector<Instruction> Finish() && {
    Add(OpKind::kOptimizerStep, 0, 0);
    return std::move(out_);
  }
  std::vector<Instruction> FinishWithoutStep() && { return std::move(out_); }

 private:
  bool IsFirst(int chunk) const { return stage_ == 0 && chunk == 0; }
  bool IsLast(int chunk) const {
    return stage_ == num_stages_ - 1 && chunk == chunks_ - 1;
  }
  void Add(OpKind op, int m, int chunk) {
    out_.push_back({op, m, chunk, step_offset_});
  }

  const int num_stages_;
  const int stage_;
  const int chunks_;
  int step_offset_ = 0;
  std::vector<Instruction> out_;
};

std::vector<Instruction> BuildGPipe(const ScheduleParams& p, int stage) {
  StreamWriter w(p.num_stages, stage, 1);
  for (int m = 0; m < p.micro_batches; ++m) w.Forward(m);
  // Ascending, so gradients accumulate in the sequential reference's order.
  for (int m = 0; m < p.micro_batches; ++m) w.Backward(m);
  return std::move(w).Finish();
}

int OneFOneBWarmup(const ScheduleParams& p, int stage) {
  return std::min(p.num_stages - stage - 1, p.micro_batches);
}

// PipeDream-Flush: warm-up forwards, then one forward and one backward at
// a time, then the cool-down backwards. At most K - s micro-batches in
// flight on stage s (warm-up + the steady state's one forward).
std::vector<Instruction> BuildOneFOneB(const ScheduleParams& p, int stage) {
  StreamWriter w(p.num_stages, stage, 1);
  const int warmup = OneFOneBWarmup(p, stage);
  const int m_total = p.micro_batches;
  for (int m = 0; m < warmup; ++m) w.Forward(m);
  for (int i = 0; i < m_total - warmup; ++i) {
    w.Forward(warmup + i);
    w.Backward(i);
  }
  for (int i = m_total - warmup; i < m_total; ++i) w.Backward(i);
  return std::move(w).Finish();
}

// The cross-step schedules: the 1F1B order of a run's micro-batches,
// numbered g = (steps since the run began) * M + m, as if the whole run were
// one long 1F1B window: F(g) is followed by B(g - w), w = CrossStepWarmup
// (K - s - 1 unless extra_warmup deepens it), and the run's last step ends
// with the remaining backwards. A step's stream holds its own forwards and
// the backwards that pair with them, which may belong to earlier steps.
// Stage s holds at most w + 1 micro-batches (K - s, as in 1F1B-flush,
// without extra warm-up).
//  - 1f1b-async (PipeDream): an update after every backward, so each
//    forward may see newer weights than the last (weight stashing).
//  - 2bw: one update per step, right after its last backward.
std::vector<Instruction> BuildCrossStep(const ScheduleParams& p, int stage) {
  StreamWriter w(p.num_stages, stage, 1);
  const int64_t m_total = p.micro_batches;
  const int64_t warmup = CrossStepWarmup(p, stage);
  const int64_t first = p.steps_before * m_total;  // this step's first g
  auto backward = [&](int64_t g) {
    const int64_t owner = g / m_total;  // steps since the run began
    const int m = static_cast<int>(g % m_total);
    w.set_step_offset(static_cast<int>(owner - p.steps_before));
    w.Backward(m);
    if (p.kind == ScheduleKind::kOneFOneBAsync || m == m_total - 1) w.Step(m);
    w.set_step_offset(0);
  };
  for (int64_t m = 0; m < m_total; ++m) {
    w.Forward(static_cast<int>(m));
    if (first + m - warmup >= 0) backward(first + m - warmup);
  }
  if (p.last_step) {
    for (int64_t g = std::max<int64_t>(0, first + m_total - warmup);
         g < first + m_total; ++g) {
      backward(g);
    }
  }
  return std::move(w).FinishWithoutStep();
}

// ZB-H1: 1F1B's order of F and B (so at most K - s micro-batches between
// F and B), with stage s running W(i - s) after B(i): W lags B by s
// micro-batches, the more the later the stage, as in Qi et al. (2023),
// Fig. 3. The deferred W passes fill the cool-down bubble; every stage
// then holds the W inputs of at most K micro-batches, 1F1B's stage-0 peak.
std::vector<Instruction> BuildZeroBubbleH1(const ScheduleParams& p, int stage) {
  StreamWriter w(p.num_stages, stage, 1);
  const int warmup = OneFOneBWarmup(p, stage);
  const int m_total = p.micro_batches;
  const int lag = stage;
  int next_w = 0;
  for (int m = 0; m < warmup; ++m) w.Forward(m);
  for (int i = 0; i < m_total - warmup; ++i) {
    w.Forward(warmup + i);
    w.Backward(i, 0, /*split=*/true);
    if (i - lag >= 0) w.BackwardWeight(next_w++);
  }
  for (int i = m_total - warmup; i < m_total; ++i) {
    w.Backward(i, 0, /*split=*/true);
    w.BackwardWeight(next_w++);
  }
  while (next_w < m_total) w.BackwardWeight(next_w++);
  return std::move(w).Finish();
}

// Megatron-LM's interleaved order: the k-th forward of a stage works on
// micro-batch group k / (K v), chunk (k mod K v) / K, micro-batch
// group * K + k mod K; the k-th backward on the same micro-batch with the
// chunk mirrored (v - 1 - c), so each chunk's backwards ascend in m.
struct ChunkStep {
  int micro_batch;
  int chunk;
};

ChunkStep InterleavedStep(const ScheduleParams& p, int k, bool forward) {
  const int group_size = p.num_stages * p.virtual_stages;
  const int in_group = k % group_size;
  const int chunk = in_group / p.num_stages;
  const int m = (k / group_size) * p.num_stages + in_group % p.num_stages;
  return {m, forward ? chunk : p.virtual_stages - 1 - chunk};
}

std::vector<Instruction> BuildInterleaved(const ScheduleParams& p, int stage) {
  StreamWriter w(p.num_stages, stage, p.virtual_stages);
  const int total = p.micro_batches * p.virtual_stages;
  const int warmup = std::min(
      (p.num_stages - stage - 1) * 2 + (p.virtual_stages - 1) * p.num_stages,
      total);
  auto forward = [&](int k) {
    const ChunkStep f = InterleavedStep(p, k, /*forward=*/true);
    w.Forward(f.micro_batch, f.chunk);
  };
  auto backward = [&](int k) {
    const ChunkStep b = InterleavedStep(p, k, /*forward=*/false);
    w.Backward(b.micro_batch, b.chunk);
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k < total - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  for (int k = total - warmup; k < total; ++k) backward(k);
  return std::move(w).Finish();
}

}  // namespace

const char* OpKindShortName(OpKind op) {
  switch (op) {
    case OpKind::kLoadInput:
      return "Load";
    case OpKind::kRecvActivation:
      return "RecvA";
    case OpKind::kForward:
      return "F";
    case OpKind::kSendActivation:
      return "SendA";
    case OpKind::kLoss:
      return "Loss";
    case OpKind::kRecvGradient:
      return "RecvG";
    case OpKind::kBackward:
      return "B";
    case OpKind::kBackwardInput:
      return "BI";
    case OpKind::kBackwardWeight:
      return "W";
    case OpKind::kSendGradient:
      return "SendG";
    case OpKind::kOptimizerStep:
      return "Step";
  }
  return "?";
}

absl::StatusOr<OpKind> ParseOpKindShortName(absl::string_view name) {
  for (int k = static_cast<int>(OpKind::kLoadInput);
       k <= static_cast<int>(OpKind::kOptimizerStep); ++k) {
    const OpKind op = static_cast<OpKind>(k);
    if (name == OpKindShortName(op)) return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown trace op \"", name, "\""));
}

const char* OpKindName(OpKind op) {
  switch (op) {
    case OpKind::kLoadInput:
      return "LoadInput";
    case OpKind::kRecvActivation:
      return "RecvActivation";
    case OpKind::kForward:
      return "Forward";
    case OpKind::kSendActivation:
      return "SendActivation";
    case OpKind::kLoss:
      return "Loss";
    case OpKind::kRecvGradient:
      return "RecvGradient";
    case OpKind::kBackward:
      return "Backward";
    case OpKind::kBackwardInput:
      return "BackwardInput";
    case OpKind::kBackwardWeight:
      return "BackwardWeight";
    case OpKind::kSendGradient:
      return "SendGradient";
    case OpKind::kOptimizerStep:
      return "OptimizerStep";
  }
  return "UnknownOp";
}

// "F3", "BI3", "W3", "SendA3@c1", "Step"; "B3@t-1", "Step@t-1" for a
// micro-batch of the previous step.
std::string ToString(const Instruction& instruction) {
  std::string out = instruction.op == OpKind::kOptimizerStep
                        ? std::string("Step")
                        : absl::StrCat(OpKindShortName(instruction.op),
                                       instruction.micro_batch);
  if (instruction.chunk != 0) absl::StrAppend(&out, "@c", instruction.chunk);
  if (instruction.step_offset != 0) {
    absl::StrAppend(&out, "@t", instruction.step_offset);
  }
  return out;
}

int CrossStepWarmup(const ScheduleParams& params, int stage) {
  return std::max(0, params.num_stages - stage - 1) *
         (1 + std::max(0, params.extra_warmup));
}

int MaxExtraWarmup(int micro_batches, int num_stages) {
  if (num_stages < 2) return kMaxExtraWarmup;
  return std::min(kMaxExtraWarmup, micro_batches / (num_stages - 1) - 1);
}

int MaxStagesForExtraWarmup(int micro_batches, int extra_warmup) {
  return micro_batches / (1 + std::max(0, extra_warmup)) + 1;
}

bool IsCrossStep(ScheduleKind kind) {
  return kind == ScheduleKind::kOneFOneBAsync || kind == ScheduleKind::kTwoBW;
}

bool ReusesWeights(ScheduleKind kind, int micro_batches) {
  return !IsCrossStep(kind) && micro_batches > 1;
}

bool DefersWeightGrads(ScheduleKind kind, int micro_batches,
                       bool rematerialize) {
  return ReusesWeights(kind, micro_batches) && !rematerialize;
}

int64_t HeldWeightGradMicroBatches(int64_t rows) {
  return rows >= kMaxHeldWeightGradRows
             ? 0
             : kMaxHeldWeightGradRows / std::max<int64_t>(1, rows);
}

int StepLookback(const ScheduleParams& params, int stage) {
  if (!IsCrossStep(params.kind) || params.micro_batches < 1) return 0;
  const int warmup = CrossStepWarmup(params, stage);
  return (warmup + params.micro_batches - 1) / params.micro_batches;
}

absl::StatusOr<std::vector<Instruction>> BuildSchedule(
    const ScheduleParams& params, int stage) {
  RETURN_IF_ERROR(ValidateParams(params));
  if (stage < 0 || stage >= params.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " outside [0, ", params.num_stages, ")"));
  }
  switch (params.kind) {
    case ScheduleKind::kGPipe:
      return BuildGPipe(params, stage);
    case ScheduleKind::kOneFOneBFlush:
      return BuildOneFOneB(params, stage);
    case ScheduleKind::kInterleaved:
      return BuildInterleaved(params, stage);
    case ScheduleKind::kZeroBubbleH1:
      return BuildZeroBubbleH1(params, stage);
    case ScheduleKind::kOneFOneBAsync:
    case ScheduleKind::kTwoBW:
      return BuildCrossStep(params, stage);
  }
  return absl::InvalidArgumentError("unknown schedule kind");
}

// Definition shared with the simulator: with uniform costs every stage is
// busy for the same ideal time I = M (F + Bk) + optimizer (Bk = full
// backward), and the bubble is the idle fraction T_idle / (I + T_idle),
// where T_idle is the idle time per stage. Sends are taken as free.
//  - GPipe, 1F1B-flush: T_idle = (K - 1)(F + Bk), so the fraction is
//    (K - 1) / (M + K - 1) when the optimizer is free.
//  - Interleaved: each chunk costs F / v and Bk / v, and the warm-up and
//    cool-down ramps shrink to chunk size: T_idle = (K - 1)(F + Bk) / v,
//    i.e. (K - 1) / (v M) of the ideal time, fraction
//    (K - 1) / (v M + K - 1).
//  - ZB-H1 with B = W = Bk / 2: Qi et al. give T_idle = (K - 1)(F + B - W)
//    for M >= K; with B = W that is (K - 1) F, a third of 1F1B's
//    3 (K - 1) F when F = B = W (Bk = 2F). With M < K the last micro-batch's
//    B chain reaches stage 0 later; the schedule then adds (K - M) W.
//    Exact when W <= F; with a larger W the W passes no longer fit the
//    cool-down gaps and the simulated bubble is larger.
double TheoreticalBubble(const ScheduleParams& params, const SimCosts& costs) {
  const double k = params.num_stages;
  const double m = params.micro_batches;
  const double work = costs.forward + costs.backward;
  double idle = 0.0;
  switch (params.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneBFlush:
    case ScheduleKind::kOneFOneBAsync:  // one window's warm-up + cool-down
    case ScheduleKind::kTwoBW:
      idle = (k - 1) * work;
      break;
    case ScheduleKind::kInterleaved:
      idle = (k - 1) * work / std::max(1, params.virtual_stages);
      break;
    case ScheduleKind::kZeroBubbleH1: {
      const double w = costs.backward / 2;
      idle = (k - 1) * costs.forward + std::max(0.0, k - m) * w;
      break;
    }
  }
  // The asynchronous schedule steps the optimizer after every micro-batch.
  const double steps = params.kind == ScheduleKind::kOneFOneBAsync ? m : 1;
  const double total = m * work + steps * costs.optimizer + idle;
  return total > 0 ? idle / total : 0.0;
}

}  // namespace pipetrain
