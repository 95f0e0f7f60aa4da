// Pipeline schedules as pure instruction streams.
//
// A schedule is a function (kind, K stages, stage s, M micro-batches) ->
// the ordered instructions stage s runs for one training step (one
// mini-batch). The stage executor runs them; the simulator checks a set of
// streams for deadlock and computes their bubble and memory. Nothing here
// knows about transport or tensors.
//
// Synchronous schedules drain the pipeline at the end of every step. The
// cross-step schedules (1f1b-async, 2bw) do not: their 1F1B steady state
// runs on across step boundaries, so a step's stream may hold backwards of
// micro-batches of earlier steps (Instruction::step_offset < 0); warm-up
// happens only in a run's first step and cool-down only in its last
// (ScheduleParams::steps_before, last_step).
#ifndef PIPETRAIN_SPEC_SCHEDULE_H_
#define PIPETRAIN_SPEC_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spec/vocabulary.h"

namespace pipetrain {

enum class OpKind {
  // Stage 0 only: take micro-batch m's inputs from the data.
  kLoadInput = 0,
  // Wait for micro-batch m's activation from the previous stage (chunk c's
  // input comes from the previous virtual stage).
  kRecvActivation,
  kForward,
  // Hand micro-batch m's output to the next stage (asynchronous).
  kSendActivation,
  // Last stage only: loss of micro-batch m against its labels (which the
  // stage reads from the data) and the gradient of its logits.
  kLoss,
  kRecvGradient,
  // Full backward (input and weight gradients).
  kBackward,
  // Zero-bubble halves of kBackward: the input gradient (B), which the
  // previous stage waits for, and the weight gradient (W), which can wait.
  kBackwardInput,
  kBackwardWeight,
  kSendGradient,
  // Apply the accumulated gradients (ends a synchronous step's stream; in
  // the cross-step schedules it follows the backward it completes).
  kOptimizerStep,
};

struct Instruction {
  OpKind op;
  int micro_batch = 0;
  // Virtual stage (model chunk) on this worker; 0 unless interleaved.
  int chunk = 0;
  // Which step the micro-batch belongs to, relative to the step whose
  // stream holds the instruction: 0 = this step, -1 = the previous one.
  // Only the cross-step schedules have negative offsets.
  int step_offset = 0;

  bool operator==(const Instruction& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk &&
           step_offset == o.step_offset;
  }
};

const char* OpKindName(OpKind op);
// The short name ToString uses: "F", "B", "BI", "W", "SendA", "Step", ...
const char* OpKindShortName(OpKind op);
// The inverse of OpKindShortName; InvalidArgument naming the text for an
// unknown name.
absl::StatusOr<OpKind> ParseOpKindShortName(absl::string_view name);
std::string ToString(const Instruction& instruction);
// True for the schedules whose pipeline runs on across step boundaries.
bool IsCrossStep(ScheduleKind kind);
// True when a stage multiplies every micro-batch of a step by unchanged
// weights (a synchronous schedule, more than one micro-batch), so it lays
// them out for the GEMM once a step and takes the weight gradients of
// several micro-batches in one product (Model::DeferWeightGrads); the
// profiler measures layers the same way for such a job.
bool ReusesWeights(ScheduleKind kind, int micro_batches);
// The most rows of its input and of its output gradient a linear layer
// holds back so that a step's weight gradients run as one product
// (worker/nn/weight_grad_queue.h).
inline constexpr int64_t kMaxHeldWeightGradRows = 256;
// How many micro-batches of `rows` rows (>= 1) such a layer holds for one
// product: as many as fit in kMaxHeldWeightGradRows; 0 when one alone
// fills it (not held).
int64_t HeldWeightGradMicroBatches(int64_t rows);
// True when a stage holds its weight-gradient products back over a step's
// micro-batches (Model::DeferWeightGrads): it reuses its weights and keeps
// its activations (rematerialization keeps only a step's stage inputs;
// holding the products' operands would undo that).
bool DefersWeightGrads(ScheduleKind kind, int micro_batches,
                       bool rematerialize);

struct ScheduleParams {
  ScheduleKind kind = ScheduleKind::kGPipe;
  int num_stages = 1;      // K (physical stages / workers)
  int micro_batches = 1;   // M
  int virtual_stages = 1;  // v, interleaved only (chunks per stage)
  // Cross-step schedules only (the others need the defaults): how many
  // steps of the same continuous run precede this one (0: the pipeline is
  // empty and this step warms it up), and whether this step ends the run
  // (drains the pipeline: cool-down). The defaults give one self-contained
  // window. The stream with last_step = true is the one with
  // last_step = false followed by the cool-down, so an executor may decide
  // late whether to drain.
  int64_t steps_before = 0;
  bool last_step = true;
  // Cross-step schedules only (0 for the others): micro-batches each hop
  // keeps in flight beyond 1F1B's one, so that a slow link's round trip is
  // covered. Stage s runs CrossStepWarmup = (K - 1 - s) * (1 + extra) forwards
  // before its first backward (1F1B: K - 1 - s) and holds one more than
  // that. Stage 0's warm-up must stay <= M: a stream then reaches back at
  // most one step, and 2bw's step t still runs on the update of step
  // t - 2 (two weight versions).
  int extra_warmup = 0;
};

// The most ScheduleParams::extra_warmup may ask for.
inline constexpr int kMaxExtraWarmup = 256;
// JobSpec.extra_warmup's "let the planner choose".
inline constexpr int kAutoExtraWarmup = -1;

// Forwards stage `stage` of a cross-step schedule runs before its first
// backward: (K - 1 - s) * (1 + extra_warmup).
int CrossStepWarmup(const ScheduleParams& params, int stage);

// The rule BuildSchedule holds extra warm-up to, stage 0's
// (K - 1)(1 + e) <= M, solved for each side: the largest e on K stages
// (kMaxExtraWarmup for one stage, which has no warm-up; -1 when M < K - 1),
// and the most stages e allows, M / (1 + e) + 1.
int MaxExtraWarmup(int micro_batches, int num_stages);
int MaxStagesForExtraWarmup(int micro_batches, int extra_warmup);

// The instructions stage `stage` runs for one step. InvalidArgument for
// K < 1, M < 1, stage outside [0, K), or parameters the kind does not allow
// (e.g. interleaved needs M divisible by K, 2bw M >= K - 1).
absl::StatusOr<std::vector<Instruction>> BuildSchedule(
    const ScheduleParams& params, int stage);

// How many steps back a stage's stream can reach (the most negative
// step_offset, negated): 0 for synchronous schedules.
int StepLookback(const ScheduleParams& params, int stage);

// Per-instruction durations for the simulator (seconds, any unit).
struct SimCosts {
  double forward = 1.0;
  double backward = 2.0;  // full backward; B and W take half each
  double send = 0.0;      // time from a send to the matching receive
  double optimizer = 0.0;
  // Links: a message occupies the stage's outgoing link for this long
  // (bytes / bandwidth) before its `send` latency starts, and messages on
  // one link queue behind each other: activations on the link to the next
  // stage, gradients on the link to the previous one. 0: unlimited capacity.
  double activation_transfer = 0.0;
  double gradient_transfer = 0.0;
  // The latency of gradient sends when it differs from `send` (< 0: send).
  double gradient_send = -1.0;
  // The weight-gradient half (W) of `backward`, when it is not half of it
  // (< 0: backward / 2); B is the rest.
  double weight_grad = -1.0;
  // Weight-gradient products held back (DefersWeightGrads): the W half of
  // a micro-batch's backward does not run in its pass; the
  // stage holds up to this many micro-batches' (per chunk) and runs them
  // together when one more would pass that, or at its optimizer step. 0:
  // each runs in its own pass.
  int held_weight_grads = 0;
  // On shared machines (SimMachines): the CPU each end of an activation
  // (gradient) message this stage sends takes on its machine, when it
  // differs from SimMachines::message_cpu (< 0: that), e.g. by its size.
  double activation_message_cpu = -1.0;
  double gradient_message_cpu = -1.0;
};

struct SimResult {
  bool deadlock = false;
  std::string deadlock_detail;  // which stage waits for what
  double makespan = 0.0;        // step time
  // Per stage: busy time and idle fraction (1 - busy / makespan).
  std::vector<double> busy;
  std::vector<double> idle_fraction;
  // Per stage: most micro-batches whose forward ran and whose backward has
  // not finished (activations held). Interleaved: counted per (micro-batch,
  // chunk), each unit holding 1/v of a stage's activations. Zero-bubble:
  // counted until B (kBackwardInput) finishes, which frees all activations
  // but the inputs W still needs; see peak_held_until_weight_grad.
  std::vector<int> peak_in_flight;
  // Mean idle fraction over the stages.
  double bubble = 0.0;
  // Per stage: as peak_in_flight, but counted until the last backward pass
  // that reads the micro-batch (W for zero-bubble, else the full backward).
  std::vector<int> peak_held_until_weight_grad;
  // InvalidArgument when the parameters, streams or costs are malformed;
  // the other fields are then left empty.
  absl::Status status;
};

// Machines whose CPUs stages share. Without it each stage runs on a CPU of
// its own and a message costs no CPU beyond its stage's passes. With it a
// stage's passes and each message's CPU share its machine's CPUs: while n
// of them run on a machine of c CPUs, each advances at min(1, c / n) of
// its own speed (processor sharing; a stage runs on one thread). A message
// takes message_cpu (or what its sending stage's SimCosts gives its
// messages) on its sender's machine and then on its receiver's,
// from the moment it is sent, and arrives once both are done and its
// latency (SimCosts::send after its transfer) has passed: when the CPUs
// are free the latency alone counts, as without machines.
struct SimMachines {
  // Per stage: its machine, an index into `cpus`; -1: one of its own that
  // is never short of a CPU (and runs its end of a message at once).
  std::vector<int> machine_of;
  std::vector<int> cpus;  // per machine, >= 1
  // Per message end, beyond the passes' share, unless the sending stage's
  // SimCosts gives its messages their own.
  double message_cpu = 0.0;
};

// Runs the K streams against each other with the given costs (uniform over
// stages, or per stage when `per_stage` is not empty), on `machines` when
// given.
SimResult Simulate(const ScheduleParams& params, const SimCosts& costs,
                   const std::vector<SimCosts>& per_stage = {},
                   const SimMachines* machines = nullptr);

// Simulates `num_steps` consecutive steps of a continuous run (step 0
// warms up, step num_steps - 1 cools down): each stage runs its steps'
// streams back to back, with micro-batch (t, m) numbered t * M + m.
// Cross-step schedules overlap the steps; synchronous ones drain after
// each. Costs uniform, or per stage when `per_stage` is not empty.
// InvalidArgument when num_steps < 1.
SimResult SimulateSteps(const ScheduleParams& params, int num_steps,
                        const SimCosts& costs,
                        const std::vector<SimCosts>& per_stage = {},
                        const SimMachines* machines = nullptr);

// Runs hand-written streams against each other: streams[s] is stage s's
// stream (K = streams.size()); an instruction of chunk c belongs to virtual
// stage c * K + s. `per_stage` holds one SimCosts per stage. For checking
// modified schedules and the simulator itself.
SimResult SimulateStreams(const std::vector<std::vector<Instruction>>& streams,
                          int virtual_stages,
                          const std::vector<SimCosts>& per_stage,
                          const SimMachines* machines = nullptr);

// The bubble fraction theory predicts for a kind with uniform costs, e.g.
// GPipe: (K - 1) / (M + K - 1); for the cross-step kinds that of one
// self-contained window (one warm-up and cool-down per M micro-batches).
double TheoreticalBubble(const ScheduleParams& params, const SimCosts& costs);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_SCHEDULE_H_
