#include "spec/schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

constexpr double kTol = 1e-9;

ScheduleParams Params(ScheduleKind kind, int k, int m, int v = 1) {
  ScheduleParams p;
  p.kind = kind;
  p.num_stages = k;
  p.micro_batches = m;
  p.virtual_stages = v;
  return p;
}

std::string Describe(const ScheduleParams& p) {
  return absl::StrCat(ScheduleKindName(p.kind), " K=", p.num_stages,
                      " M=", p.micro_batches, " v=", p.virtual_stages);
}

std::vector<std::vector<Instruction>> AllStreams(const ScheduleParams& p) {
  std::vector<std::vector<Instruction>> streams;
  for (int s = 0; s < p.num_stages; ++s) {
    absl::StatusOr<std::vector<Instruction>> stream = BuildSchedule(p, s);
    EXPECT_TRUE(stream.ok()) << stream.status();
    streams.push_back(stream.ok() ? *stream : std::vector<Instruction>{});
  }
  return streams;
}

std::string Join(const std::vector<Instruction>& stream) {
  return absl::StrJoin(stream, " ", [](std::string* out, const Instruction& i) {
    out->append(ToString(i));
  });
}

// Every parameter set the invariant and bubble tests sweep.
std::vector<ScheduleParams> Sweep() {
  std::vector<ScheduleParams> all;
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 32; ++m) {
      for (ScheduleKind kind :
           {ScheduleKind::kGPipe, ScheduleKind::kOneFOneBFlush,
            ScheduleKind::kZeroBubbleH1}) {
        all.push_back(Params(kind, k, m));
      }
      if (m % k != 0) continue;
      for (int v : {2, 3}) {
        all.push_back(Params(ScheduleKind::kInterleaved, k, m, v));
      }
    }
  }
  return all;
}

// Key of one (op, virtual stage, micro-batch) occurrence.
using OpKey = std::tuple<OpKind, int, int>;

std::map<OpKey, int> CountOps(const ScheduleParams& p,
                              const std::vector<std::vector<Instruction>>& s) {
  std::map<OpKey, int> counts;
  for (int stage = 0; stage < p.num_stages; ++stage) {
    for (const Instruction& in : s[stage]) {
      ++counts[{in.op, in.chunk * p.num_stages + stage, in.micro_batch}];
    }
  }
  return counts;
}

// Per virtual stage and micro-batch: one forward and one backward (or B
// and W), input from the data or the previous virtual stage, output to the
// loss or the next one, gradients matched the other way.
void ExpectOneOfEach(const ScheduleParams& p,
                     const std::map<OpKey, int>& counts) {
  const int vk = p.num_stages * p.virtual_stages;
  const bool zb = p.kind == ScheduleKind::kZeroBubbleH1;
  auto count = [&](OpKind op, int j, int m) {
    auto it = counts.find({op, j, m});
    return it == counts.end() ? 0 : it->second;
  };
  for (int j = 0; j < vk; ++j) {
    for (int m = 0; m < p.micro_batches; ++m) {
      SCOPED_TRACE(absl::StrCat("virtual stage ", j, " micro-batch ", m));
      EXPECT_EQ(count(OpKind::kForward, j, m), 1);
      EXPECT_EQ(count(OpKind::kBackward, j, m), zb ? 0 : 1);
      EXPECT_EQ(count(OpKind::kBackwardInput, j, m), zb ? 1 : 0);
      EXPECT_EQ(count(OpKind::kBackwardWeight, j, m), zb ? 1 : 0);
      EXPECT_EQ(count(OpKind::kLoadInput, j, m), j == 0 ? 1 : 0);
      EXPECT_EQ(count(OpKind::kRecvActivation, j, m), j == 0 ? 0 : 1);
      EXPECT_EQ(count(OpKind::kLoss, j, m), j == vk - 1 ? 1 : 0);
      EXPECT_EQ(count(OpKind::kSendActivation, j, m), j == vk - 1 ? 0 : 1);
      EXPECT_EQ(count(OpKind::kRecvGradient, j, m), j == vk - 1 ? 0 : 1);
      EXPECT_EQ(count(OpKind::kSendGradient, j, m), j == 0 ? 0 : 1);
    }
  }
}

// Within a stream: F before its backward, W after its B, backwards of a
// chunk in ascending micro-batch order, one OptimizerStep at the end.
void ExpectStreamOrder(const std::vector<Instruction>& stream) {
  ASSERT_FALSE(stream.empty());
  EXPECT_EQ(stream.back().op, OpKind::kOptimizerStep);
  std::map<std::pair<int, int>, int> done;  // (chunk, m) -> passes so far
  std::map<int, int> last_backward;         // chunk -> last m
  int steps = 0;
  for (const Instruction& in : stream) {
    const std::pair<int, int> key{in.chunk, in.micro_batch};
    switch (in.op) {
      case OpKind::kForward:
        EXPECT_EQ(done[key]++, 0) << ToString(in);
        break;
      case OpKind::kBackward:
      case OpKind::kBackwardInput: {
        EXPECT_EQ(done[key]++, 1) << ToString(in);
        auto it = last_backward.find(in.chunk);
        if (it != last_backward.end()) {
          EXPECT_GT(in.micro_batch, it->second);
        }
        last_backward[in.chunk] = in.micro_batch;
        break;
      }
      case OpKind::kBackwardWeight:
        EXPECT_EQ(done[key]++, 2) << ToString(in);
        break;
      case OpKind::kOptimizerStep:
        ++steps;
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(steps, 1);
}

TEST(ScheduleTest, EveryKindIsCompleteAndDeadlockFree) {
  for (const ScheduleParams& p : Sweep()) {
    SCOPED_TRACE(Describe(p));
    const std::vector<std::vector<Instruction>> streams = AllStreams(p);
    for (const std::vector<Instruction>& stream : streams) {
      ExpectStreamOrder(stream);
    }
    ExpectOneOfEach(p, CountOps(p, streams));
    const SimResult r = Simulate(p, SimCosts{});
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_FALSE(r.deadlock) << r.deadlock_detail;
    if (HasFailure()) return;  // one parameter set's failures are enough
  }
}

TEST(ScheduleTest, GPipeBubbleAndMemory) {
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 32; ++m) {
      const ScheduleParams p = Params(ScheduleKind::kGPipe, k, m);
      SCOPED_TRACE(Describe(p));
      const SimResult r = Simulate(p, SimCosts{});
      EXPECT_NEAR(r.bubble, double(k - 1) / (m + k - 1), kTol);
      EXPECT_NEAR(r.bubble, TheoreticalBubble(p, SimCosts{}), kTol);
      for (int s = 0; s < k; ++s) EXPECT_EQ(r.peak_in_flight[s], m);
    }
  }
}

TEST(ScheduleTest, OneFOneBFlushBubbleAndMemory) {
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 32; ++m) {
      const ScheduleParams p = Params(ScheduleKind::kOneFOneBFlush, k, m);
      SCOPED_TRACE(Describe(p));
      const SimResult r = Simulate(p, SimCosts{});
      EXPECT_NEAR(r.bubble, double(k - 1) / (m + k - 1), kTol);
      EXPECT_NEAR(r.bubble, TheoreticalBubble(p, SimCosts{}), kTol);
      for (int s = 0; s < k; ++s) {
        EXPECT_LE(r.peak_in_flight[s], k - s);
        EXPECT_EQ(r.peak_in_flight[s], std::min(k - s, m));
      }
    }
  }
}

// Forward and backward of unequal cost: the 1F1B / GPipe bubble is still
// (K-1)(F+Bk) of idle time per stage.
TEST(ScheduleTest, FlushBubblesHoldForOtherCostRatios) {
  for (SimCosts c :
       {SimCosts{1.0, 1.0}, SimCosts{2.0, 1.0}, SimCosts{0.5, 3.0, 0.0, 0.7}}) {
    for (ScheduleKind kind :
         {ScheduleKind::kGPipe, ScheduleKind::kOneFOneBFlush}) {
      const ScheduleParams p = Params(kind, 4, 6);
      SCOPED_TRACE(Describe(p));
      const SimResult r = Simulate(p, c);
      EXPECT_NEAR(r.makespan, 9 * (c.forward + c.backward) + c.optimizer, kTol);
      EXPECT_NEAR(r.bubble, TheoreticalBubble(p, c), kTol);
    }
  }
}

// A stage that holds its weight-gradient products back runs them at its
// optimizer step: the deferred W passes no longer fill ZB-H1's bubble,
// which leaves it no faster than GPipe (K = 2, M = 2, F = 1, B = W = 1;
// worked by hand).
TEST(ScheduleTest, HeldWeightGradientsRunAtTheOptimizerStep) {
  SimCosts run;  // each W in its pass
  SimCosts held;
  held.held_weight_grads = 2;
  EXPECT_NEAR(Simulate(Params(ScheduleKind::kGPipe, 2, 2), run).makespan, 9,
              kTol);
  EXPECT_NEAR(Simulate(Params(ScheduleKind::kZeroBubbleH1, 2, 2), run).makespan,
              7, kTol);
  // Stage 1 sends each input gradient after B alone (1 instead of 2) and
  // both stages add their two W passes at the end.
  EXPECT_NEAR(Simulate(Params(ScheduleKind::kGPipe, 2, 2), held).makespan, 8,
              kTol);
  EXPECT_NEAR(
      Simulate(Params(ScheduleKind::kZeroBubbleH1, 2, 2), held).makespan, 8,
      kTol);
  // Held one at a time, a W runs with the next micro-batch's backward:
  // stage 1 of GPipe runs B0 [3, 4], B1 + W0 [4, 6], the optimizer step +
  // W1 [6, 7]; stage 0 B0 [4, 5], B1 + W0 [6, 8], then + W1 [8, 9].
  held.held_weight_grads = 1;
  EXPECT_NEAR(Simulate(Params(ScheduleKind::kGPipe, 2, 2), held).makespan, 9,
              kTol);
  // An uneven W share: B = 0.5, W = 1.5 of a backward of 2.
  SimCosts uneven = run;
  uneven.weight_grad = 1.5;
  const SimResult r =
      Simulate(Params(ScheduleKind::kZeroBubbleH1, 2, 2), uneven);
  // Stage 1: F0 [1, 2], B0 [2, 2.5], F1 [2.5, 3.5], B1 [3.5, 4], W0
  // [4, 5.5], W1 [5.5, 7]. Stage 0: F0 F1 [0, 2], B0 [2.5, 3], W0
  // [3, 4.5], B1 [4.5, 5], W1 [5, 6.5].
  EXPECT_NEAR(r.makespan, 7, kTol);
  EXPECT_NEAR(r.busy[0], 6, kTol);
}

TEST(ScheduleTest, ZeroBubbleH1CutsTheBubbleToAThird) {
  const SimCosts c;  // F = 1, B = W = 1
  for (int k = 2; k <= 8; ++k) {
    for (int m = k; m <= 32; ++m) {
      SCOPED_TRACE(absl::StrCat("K=", k, " M=", m));
      const ScheduleParams zb = Params(ScheduleKind::kZeroBubbleH1, k, m);
      const SimResult r = Simulate(zb, c);
      const SimResult flush =
          Simulate(Params(ScheduleKind::kOneFOneBFlush, k, m), c);
      EXPECT_LT(r.bubble, flush.bubble);
      EXPECT_NEAR(r.bubble, TheoreticalBubble(zb, c), kTol);
      // Idle time per stage: (K-1)(F+B-W) = K-1 against 1F1B's 3(K-1).
      EXPECT_NEAR(r.makespan - m * 3.0, k - 1, kTol);
      EXPECT_NEAR(flush.makespan - m * 3.0, 3.0 * (k - 1), kTol);
    }
  }
}

TEST(ScheduleTest, ZeroBubbleH1MemoryMatchesOneFOneB) {
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 32; ++m) {
      const ScheduleParams p = Params(ScheduleKind::kZeroBubbleH1, k, m);
      SCOPED_TRACE(Describe(p));
      const SimResult r = Simulate(p, SimCosts{});
      for (int s = 0; s < k; ++s) {
        EXPECT_LE(r.peak_in_flight[s], k - s);
        // W's inputs: never more than 1F1B's stage 0 holds.
        EXPECT_LE(r.peak_held_until_weight_grad[s], std::min(k, m));
      }
    }
  }
}

// The formula, (K-1) F + max(0, K-M) W of idle time, also holds for
// M < K and for other costs as long as W = Bk/2 <= F.
TEST(ScheduleTest, ZeroBubbleH1MatchesFormulaForOtherCosts) {
  for (SimCosts c :
       {SimCosts{2.0, 2.0}, SimCosts{3.0, 2.0}, SimCosts{1.0, 1.0, 0.0, 0.5}}) {
    for (int k = 1; k <= 8; ++k) {
      for (int m = 1; m <= 16; ++m) {
        const ScheduleParams p = Params(ScheduleKind::kZeroBubbleH1, k, m);
        SCOPED_TRACE(absl::StrCat(Describe(p), " F=", c.forward));
        EXPECT_NEAR(Simulate(p, c).bubble, TheoreticalBubble(p, c), kTol);
      }
    }
  }
}

TEST(ScheduleTest, InterleavedBubbleMatchesFormula) {
  for (SimCosts c : {SimCosts{}, SimCosts{1.0, 1.0}, SimCosts{3.0, 2.0}}) {
    for (int v : {2, 3}) {
      for (int k = 2; k <= 8; ++k) {
        for (int m = k; m <= 32; m += k) {
          const ScheduleParams p = Params(ScheduleKind::kInterleaved, k, m, v);
          SCOPED_TRACE(Describe(p));
          const SimResult r = Simulate(p, c);
          const double idle = (k - 1) * (c.forward + c.backward) / v;
          EXPECT_NEAR(r.makespan, m * (c.forward + c.backward) + idle, kTol);
          EXPECT_NEAR(r.bubble, TheoreticalBubble(p, c), kTol);
          const SimResult flush =
              Simulate(Params(ScheduleKind::kOneFOneBFlush, k, m), c);
          EXPECT_LT(r.bubble, flush.bubble);
          for (int s = 0; s < k; ++s) {
            // Chunk units: Megatron's warm-up plus the steady forward.
            EXPECT_LE(r.peak_in_flight[s],
                      std::min((k - s - 1) * 2 + (v - 1) * k + 1, m * v));
          }
        }
      }
    }
  }
}

TEST(ScheduleTest, InterleavedFormulaInFractions) {
  const ScheduleParams p = Params(ScheduleKind::kInterleaved, 4, 8, 2);
  EXPECT_NEAR(Simulate(p, SimCosts{}).bubble, 3.0 / (2 * 8 + 3), kTol);
}

TEST(ScheduleTest, GPipeStreamsForTwoStages) {
  const ScheduleParams p = Params(ScheduleKind::kGPipe, 2, 2);
  const std::vector<std::vector<Instruction>> s = AllStreams(p);
  EXPECT_EQ(Join(s[0]),
            "Load0 F0 SendA0 Load1 F1 SendA1 RecvG0 B0 RecvG1 B1 Step");
  EXPECT_EQ(Join(s[1]),
            "RecvA0 F0 Loss0 RecvA1 F1 Loss1 B0 SendG0 B1 SendG1 Step");
}

TEST(ScheduleTest, OneFOneBFlushStreamOfFirstStage) {
  const ScheduleParams p = Params(ScheduleKind::kOneFOneBFlush, 3, 4);
  const std::vector<Instruction> want = {
      {OpKind::kLoadInput, 0},      {OpKind::kForward, 0},
      {OpKind::kSendActivation, 0}, {OpKind::kLoadInput, 1},
      {OpKind::kForward, 1},        {OpKind::kSendActivation, 1},
      {OpKind::kLoadInput, 2},      {OpKind::kForward, 2},
      {OpKind::kSendActivation, 2}, {OpKind::kRecvGradient, 0},
      {OpKind::kBackward, 0},       {OpKind::kLoadInput, 3},
      {OpKind::kForward, 3},        {OpKind::kSendActivation, 3},
      {OpKind::kRecvGradient, 1},   {OpKind::kBackward, 1},
      {OpKind::kRecvGradient, 2},   {OpKind::kBackward, 2},
      {OpKind::kRecvGradient, 3},   {OpKind::kBackward, 3},
      {OpKind::kOptimizerStep, 0}};
  absl::StatusOr<std::vector<Instruction>> got = BuildSchedule(p, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want) << Join(*got);
}

TEST(ScheduleTest, ZeroBubbleH1StreamsForTwoStages) {
  const std::vector<std::vector<Instruction>> s =
      AllStreams(Params(ScheduleKind::kZeroBubbleH1, 2, 3));
  EXPECT_EQ(Join(s[0]),
            "Load0 F0 SendA0 Load1 F1 SendA1 RecvG0 BI0 W0 Load2 F2 SendA2 "
            "RecvG1 BI1 W1 RecvG2 BI2 W2 Step");
  // The last stage lags W by one micro-batch.
  EXPECT_EQ(Join(s[1]),
            "RecvA0 F0 Loss0 BI0 SendG0 RecvA1 F1 Loss1 BI1 SendG1 W0 "
            "RecvA2 F2 Loss2 BI2 SendG2 W1 W2 Step");
}

TEST(ScheduleTest, InterleavedStreamsForTwoStages) {
  const std::vector<std::vector<Instruction>> s =
      AllStreams(Params(ScheduleKind::kInterleaved, 2, 2, 2));
  EXPECT_EQ(Join(s[0]),
            "Load0 F0 SendA0 Load1 F1 SendA1 RecvA0@c1 F0@c1 SendA0@c1 "
            "RecvA1@c1 F1@c1 SendA1@c1 RecvG0@c1 B0@c1 SendG0@c1 "
            "RecvG1@c1 B1@c1 SendG1@c1 RecvG0 B0 RecvG1 B1 Step");
  EXPECT_EQ(Join(s[1]),
            "RecvA0 F0 SendA0 RecvA1 F1 SendA1 RecvA0@c1 F0@c1 Loss0@c1 "
            "B0@c1 SendG0@c1 RecvA1@c1 F1@c1 Loss1@c1 B1@c1 SendG1@c1 "
            "RecvG0 B0 SendG0 RecvG1 B1 SendG1 Step");
}

TEST(ScheduleTest, SendLatencyDelaysEveryHop) {
  SimCosts c;
  c.send = 0.25;
  const SimResult r = Simulate(Params(ScheduleKind::kGPipe, 3, 4), c);
  // (M+K-1)(F+Bk) plus one latency per hop, K-1 down and K-1 back up.
  EXPECT_NEAR(r.makespan, 6 * 3.0 + 4 * 0.25, kTol);
}

TEST(ScheduleTest, SlowStageSetsThePace) {
  const SimCosts fast;
  const SimCosts slow{2.0, 4.0};
  const SimResult r =
      Simulate(Params(ScheduleKind::kGPipe, 2, 2), fast, {fast, slow});
  // Stage 1: F0 [1,3] F1 [3,5] B0 [5,9] B1 [9,13]; stage 0: B1 [13,15].
  EXPECT_NEAR(r.makespan, 15.0, kTol);
  EXPECT_NEAR(r.busy[0], 6.0, kTol);
  EXPECT_NEAR(r.busy[1], 12.0, kTol);
  EXPECT_NEAR(r.idle_fraction[1], 1.0 - 12.0 / 15.0, kTol);
}

TEST(ScheduleTest, DeadlockIsReportedWithTheBlockedStage) {
  // Stage 0 waits for a gradient before sending the activation it needs.
  const std::vector<std::vector<Instruction>> streams = {
      {{OpKind::kLoadInput, 0},
       {OpKind::kForward, 0},
       {OpKind::kRecvGradient, 0},
       {OpKind::kSendActivation, 0},
       {OpKind::kBackward, 0}},
      {{OpKind::kRecvActivation, 0},
       {OpKind::kForward, 0},
       {OpKind::kLoss, 0},
       {OpKind::kBackward, 0},
       {OpKind::kSendGradient, 0}}};
  const SimResult r = SimulateStreams(streams, 1, {SimCosts{}, SimCosts{}});
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.deadlock);
  EXPECT_THAT(r.deadlock_detail, HasSubstr("stage 0 blocked at RecvG0"));
  EXPECT_THAT(r.deadlock_detail, HasSubstr("stage 1 blocked at RecvA0"));
}

TEST(ScheduleTest, MalformedStreamsAreRejected) {
  const std::vector<SimCosts> two(2);
  // Stage 0 has no previous virtual stage to receive from.
  EXPECT_EQ(SimulateStreams({{{OpKind::kRecvActivation, 0}}, {}}, 1, two)
                .status.code(),
            absl::StatusCode::kInvalidArgument);
  // The same activation sent twice.
  EXPECT_EQ(
      SimulateStreams(
          {{{OpKind::kSendActivation, 0}, {OpKind::kSendActivation, 0}}, {}}, 1,
          two)
          .status.code(),
      absl::StatusCode::kInvalidArgument);
  // One SimCosts per stage.
  EXPECT_EQ(SimulateStreams({{}, {}}, 1, {SimCosts{}}).status.code(),
            absl::StatusCode::kInvalidArgument);
  SimCosts negative;
  negative.forward = -1;
  EXPECT_EQ(
      Simulate(Params(ScheduleKind::kGPipe, 2, 2), negative).status.code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ScheduleTest, BadParametersAreInvalidArgument) {
  const std::vector<std::pair<ScheduleParams, int>> bad = {
      {Params(ScheduleKind::kGPipe, 0, 4), 0},
      {Params(ScheduleKind::kGPipe, 2, 0), 0},
      {Params(ScheduleKind::kOneFOneBFlush, 2, 4), -1},
      {Params(ScheduleKind::kOneFOneBFlush, 2, 4), 2},
      {Params(ScheduleKind::kInterleaved, 4, 6, 2), 0},  // M % K != 0
      {Params(ScheduleKind::kInterleaved, 2, 4, 1), 0},  // v < 2
      {Params(ScheduleKind::kGPipe, 2, 4, 2), 0},        // v only interleaved
      {Params(ScheduleKind::kZeroBubbleH1, 1 << 12, 1 << 12), 0},
      {Params(static_cast<ScheduleKind>(17), 2, 2), 0},
      {Params(ScheduleKind::kTwoBW, 4, 2), 0},  // M < K - 1
  };
  for (const auto& [params, stage] : bad) {
    SCOPED_TRACE(absl::StrCat(Describe(params), " stage ", stage));
    EXPECT_EQ(BuildSchedule(params, stage).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Simulate(Params(ScheduleKind::kInterleaved, 4, 6, 2), SimCosts{})
                .status.code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScheduleTest, InstructionsPrintShortly) {
  EXPECT_EQ(ToString({OpKind::kForward, 3}), "F3");
  EXPECT_EQ(ToString({OpKind::kBackward, 3}), "B3");
  EXPECT_EQ(ToString({OpKind::kBackwardInput, 3}), "BI3");
  EXPECT_EQ(ToString({OpKind::kBackwardWeight, 3}), "W3");
  EXPECT_EQ(ToString({OpKind::kSendActivation, 3, 1}), "SendA3@c1");
  EXPECT_EQ(ToString({OpKind::kOptimizerStep}), "Step");
  EXPECT_EQ(ToString({OpKind::kBackward, 3, 0, -1}), "B3@t-1");
  EXPECT_STREQ(OpKindName(OpKind::kRecvGradient), "RecvGradient");
}

// The stream of a cross-step kind's step `t` of a run of `n` steps.
std::vector<Instruction> StepStream(ScheduleParams p, int stage, int t, int n) {
  p.steps_before = t;
  p.last_step = t == n - 1;
  absl::StatusOr<std::vector<Instruction>> stream = BuildSchedule(p, stage);
  EXPECT_TRUE(stream.ok()) << stream.status();
  return stream.ok() ? *stream : std::vector<Instruction>{};
}

// Over a run of n steps, every micro-batch (t, m) of every stage gets one
// forward, in its own step's stream, and then one backward, at most
// StepLookback steps later and in the global order (t, m); 1f1b-async
// updates after every backward, 2bw once after each step's last one.
// The last step's stream extends the non-last one by the cool-down.
TEST(ScheduleTest, CrossStepRunsPairEveryForwardWithOneLaterBackward) {
  for (ScheduleKind kind :
       {ScheduleKind::kOneFOneBAsync, ScheduleKind::kTwoBW}) {
    for (int k = 1; k <= 5; ++k) {
      for (int m = 1; m <= 6; ++m) {
        for (int extra = 0; extra <= 2; ++extra) {
          if (kind == ScheduleKind::kTwoBW && m < k - 1) continue;
          ScheduleParams p = Params(kind, k, m);
          p.extra_warmup = extra;
          if (extra > 0 && CrossStepWarmup(p, 0) > m) {
            EXPECT_EQ(BuildSchedule(p, 0).status().code(),
                      absl::StatusCode::kInvalidArgument);
            continue;
          }
          for (int stage = 0; stage < k; ++stage) {
            SCOPED_TRACE(
                absl::StrCat(Describe(p), " extra ", extra, " stage ", stage));
            const int warmup = (k - stage - 1) * (1 + extra);
            EXPECT_EQ(CrossStepWarmup(p, stage), warmup);
            const int lookback = StepLookback(p, stage);
            EXPECT_EQ(lookback, (warmup + m - 1) / m);
            if (kind == ScheduleKind::kTwoBW) {
              EXPECT_LE(lookback, 1);
            }
            for (int n = 1; n <= 4; ++n) {
              std::map<int64_t, int> forwards;  // global micro-batch -> count
              int64_t next_backward = 0;
              int updates = 0;
              for (int t = 0; t < n; ++t) {
                const std::vector<Instruction> stream =
                    StepStream(p, stage, t, n);
                const std::vector<Instruction> steady =
                    StepStream(p, stage, t, n + 1);  // t is not last there
                ASSERT_LE(steady.size(), stream.size());
                EXPECT_TRUE(
                    std::equal(steady.begin(), steady.end(), stream.begin()));
                for (const Instruction& in : stream) {
                  EXPECT_LE(in.step_offset, 0);
                  EXPECT_GE(in.step_offset, -lookback);
                  const int64_t g =
                      int64_t{t + in.step_offset} * m + in.micro_batch;
                  if (in.op == OpKind::kForward) {
                    EXPECT_EQ(in.step_offset, 0);
                    ++forwards[g];
                  } else if (in.op == OpKind::kBackward) {
                    EXPECT_EQ(g, next_backward++);
                    EXPECT_EQ(forwards[g], 1);
                  } else if (in.op == OpKind::kOptimizerStep) {
                    ++updates;
                    EXPECT_EQ(g, next_backward - 1);  // right after a backward
                  }
                }
              }
              EXPECT_EQ(next_backward, int64_t{n} * m);
              EXPECT_EQ(static_cast<int64_t>(forwards.size()), int64_t{n} * m);
              EXPECT_EQ(updates, kind == ScheduleKind::kTwoBW ? n : n * m);
            }
          }
        }
      }
    }
  }
}

// Extra warm-up keeps a slow link's round trip covered: with K = 2, M = 4,
// 4 ms forward and 8 ms backward per micro-batch and 20 ms one way, plain
// 2BW waits for the gradient of each micro-batch (steady step 128 ms);
// three more micro-batches in flight bring it to 51 ms, against 48 ms
// with no latency, and stage 0 holds 1 + (1 + 3) activations.
TEST(ScheduleTest, ExtraWarmUpCoversTheRoundTrip) {
  SimCosts near;
  near.forward = 4e-3;
  near.backward = 8e-3;
  SimCosts far = near;
  far.send = 20e-3;
  // The steady step: the difference between runs of 6 and 2 steps, per step.
  auto steady = [](const ScheduleParams& p, const SimCosts& c) {
    const SimResult six = SimulateSteps(p, 6, c);
    const SimResult two = SimulateSteps(p, 2, c);
    EXPECT_TRUE(six.status.ok() && two.status.ok()) << six.status;
    EXPECT_FALSE(six.deadlock) << six.deadlock_detail;
    return (six.makespan - two.makespan) / 4;
  };
  for (ScheduleKind kind :
       {ScheduleKind::kTwoBW, ScheduleKind::kOneFOneBAsync}) {
    ScheduleParams p = Params(kind, 2, 4);
    SCOPED_TRACE(Describe(p));
    EXPECT_NEAR(steady(p, near), 0.048, 1e-3);
    EXPECT_NEAR(steady(p, far), 0.128, 1e-9);
    p.extra_warmup = 3;
    EXPECT_NEAR(steady(p, far), 0.051, 1e-9);
    EXPECT_NEAR(steady(p, near), 0.048, 1e-9);
    EXPECT_EQ(SimulateSteps(p, 6, far).peak_in_flight[0], 5);
  }
  // Stage 0's first step, extra warm-up 1: two forwards before the first
  // backward.
  ScheduleParams p = Params(ScheduleKind::kTwoBW, 2, 4);
  p.extra_warmup = 1;
  p.last_step = false;
  auto stream = BuildSchedule(p, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(Join(*stream),
            "Load0 F0 SendA0 Load1 F1 SendA1 Load2 F2 SendA2 RecvG0 B0 "
            "Load3 F3 SendA3 RecvG1 B1");
}

// extra_warmup belongs to the cross-step kinds, and stage 0's warm-up may
// not exceed a step.
TEST(ScheduleTest, ExtraWarmUpIsCheckedAgainstKindAndStep) {
  ScheduleParams p = Params(ScheduleKind::kOneFOneBFlush, 2, 4);
  p.extra_warmup = 1;
  EXPECT_EQ(BuildSchedule(p, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  p = Params(ScheduleKind::kTwoBW, 3, 4);
  p.extra_warmup = 1;  // stage 0: 2 x 2 = 4 forwards: allowed
  EXPECT_TRUE(BuildSchedule(p, 0).ok());
  p.extra_warmup = 2;  // 6 > M
  EXPECT_EQ(BuildSchedule(p, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.extra_warmup = -1;
  EXPECT_EQ(BuildSchedule(p, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // MaxExtraWarmup and MaxStagesForExtraWarmup are that rule solved.
  for (int k = 2; k <= 5; ++k) {
    for (int m = k - 1; m <= 12; ++m) {
      ScheduleParams q = Params(ScheduleKind::kTwoBW, k, m);
      q.extra_warmup = MaxExtraWarmup(m, k);
      SCOPED_TRACE(absl::StrCat(Describe(q), " extra ", q.extra_warmup));
      EXPECT_TRUE(BuildSchedule(q, 0).ok());
      EXPECT_LE(k, MaxStagesForExtraWarmup(m, q.extra_warmup));
      ++q.extra_warmup;
      EXPECT_FALSE(BuildSchedule(q, 0).ok());
      EXPECT_GT(k, MaxStagesForExtraWarmup(m, q.extra_warmup));
    }
  }
}

// Without a flush only a run's first warm-up and last cool-down cost: the
// bubble of n consecutive steps is (K - 1) / (n M + K - 1), shrinking as
// the run gets longer, where a draining schedule's stays put.
TEST(ScheduleTest, ConsecutiveCrossStepsShrinkTheBubble) {
  const SimCosts c;
  for (ScheduleKind kind :
       {ScheduleKind::kOneFOneBAsync, ScheduleKind::kTwoBW}) {
    for (int k : {2, 4}) {
      const int m = 4;
      const ScheduleParams p = Params(kind, k, m);
      double previous = 1.0;
      for (int n = 1; n <= 5; ++n) {
        SCOPED_TRACE(absl::StrCat(Describe(p), " steps ", n));
        const SimResult r = SimulateSteps(p, n, c);
        ASSERT_TRUE(r.status.ok()) << r.status;
        ASSERT_FALSE(r.deadlock) << r.deadlock_detail;
        EXPECT_NEAR(r.bubble, (k - 1.0) / (n * m + k - 1.0), 1e-9);
        EXPECT_LT(r.bubble, previous);
        previous = r.bubble;
        for (int s = 0; s < k; ++s) EXPECT_LE(r.peak_in_flight[s], k - s);
      }
      EXPECT_NEAR(SimulateSteps(p, 1, c).bubble, TheoreticalBubble(p, c), 1e-9);
    }
  }
  // 1F1B-flush drains after every step: the same bubble however long.
  const ScheduleParams flush = Params(ScheduleKind::kOneFOneBFlush, 4, 4);
  for (int n = 1; n <= 3; ++n) {
    const SimResult r = SimulateSteps(flush, n, c);
    ASSERT_FALSE(r.deadlock) << r.deadlock_detail;
    EXPECT_NEAR(r.bubble, TheoreticalBubble(flush, c), 1e-9);
  }
  EXPECT_EQ(SimulateSteps(flush, 0, c).status.code(),
            absl::StatusCode::kInvalidArgument);
}

// Only the cross-step kinds take steps_before / last_step.
TEST(ScheduleTest, DrainingKindsRejectCrossStepParameters) {
  ScheduleParams p = Params(ScheduleKind::kGPipe, 2, 4);
  p.last_step = false;
  EXPECT_EQ(BuildSchedule(p, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  p = Params(ScheduleKind::kZeroBubbleH1, 2, 4);
  p.steps_before = 1;
  EXPECT_EQ(BuildSchedule(p, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StepLookback(p, 0), 0);
}

// Stage 0 of 3 in 2bw's steady state: the previous step's tail (its last
// two backwards and its update) interleaves with this step's forwards.
TEST(ScheduleTest, TwoBWSteadyStreamOfFirstStage) {
  ScheduleParams p = Params(ScheduleKind::kTwoBW, 3, 3);
  p.steps_before = 1;
  p.last_step = false;
  auto stream = BuildSchedule(p, 0);
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(Join(*stream),
            "Load0 F0 SendA0 RecvG1@t-1 B1@t-1 "
            "Load1 F1 SendA1 RecvG2@t-1 B2@t-1 Step@t-1 "
            "Load2 F2 SendA2 RecvG0 B0");
}

}  // namespace
}  // namespace pipetrain
