// The simulator on shared machines (SimMachines): stages and messages share
// a machine's CPUs by processor sharing, and each message's two ends take
// CPU before it arrives. Every expected figure is worked out by hand from
// the streams, or is the unshared simulator's where nothing is short of a
// CPU.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "spec/schedule.h"

namespace pipetrain {
namespace {

constexpr double kTol = 1e-9;

ScheduleParams Params(ScheduleKind kind, int k, int m) {
  ScheduleParams p;
  p.kind = kind;
  p.num_stages = k;
  p.micro_batches = m;
  return p;
}

SimMachines OneMachine(int stages, int cpus, double message_cpu) {
  SimMachines machines;
  machines.machine_of.assign(stages, 0);
  machines.cpus = {cpus};
  machines.message_cpu = message_cpu;
  return machines;
}

// With a CPU for everything that runs, sharing changes nothing: machines
// of their own, or one machine with a CPU per stage and no message CPU.
TEST(SharedMachinesTest, WithACpuForEachStageTheStepIsTheUnsharedOne) {
  SimCosts c;
  c.send = 0.3;
  c.optimizer = 0.5;
  c.activation_transfer = 0.2;
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneBFlush,
        ScheduleKind::kZeroBubbleH1, ScheduleKind::kOneFOneBAsync}) {
    SCOPED_TRACE(ScheduleKindName(kind));
    const ScheduleParams p = Params(kind, 3, 6);
    const SimResult alone = Simulate(p, c);
    ASSERT_TRUE(alone.status.ok()) << alone.status;
    SimMachines own;
    own.machine_of = {-1, -1, -1};
    own.message_cpu = 0.7;  // at once, on CPUs of their own
    const SimMachines cpu_each = OneMachine(3, 3, 0.0);
    for (const SimMachines* machines :
         std::vector<const SimMachines*>{&own, &cpu_each}) {
      const SimResult shared = Simulate(p, c, {}, machines);
      ASSERT_TRUE(shared.status.ok()) << shared.status;
      EXPECT_FALSE(shared.deadlock);
      EXPECT_NEAR(shared.makespan, alone.makespan, kTol);
      for (int s = 0; s < 3; ++s) {
        EXPECT_NEAR(shared.busy[s], alone.busy[s], kTol);
      }
    }
  }
}

// GPipe, K = 2, M = 2 (F 1, B 2) on one CPU. Stage 0's F1 and stage 1's
// F0 run together at half speed over [1, 3]; stage 1's F1 runs alone
// [3, 4] and its first backward [4, 6]; then both stages' backwards share
// [6, 10]; stage 0's last backward runs alone [10, 12].
TEST(SharedMachinesTest, StagesOnOneCpuRunAtHalfSpeedTogether) {
  const SimMachines machine = OneMachine(2, 1, 0.0);
  const SimResult r =
      Simulate(Params(ScheduleKind::kGPipe, 2, 2), SimCosts{}, {}, &machine);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_NEAR(r.makespan, 12.0, kTol);
  // Each stage's 6 units of work took 9 of the clock.
  EXPECT_NEAR(r.busy[0], 9.0, kTol);
  EXPECT_NEAR(r.busy[1], 9.0, kTol);
  // Alone, each stage keeps its own pace: 3 + 3 + ... = a step of 9.
  EXPECT_NEAR(Simulate(Params(ScheduleKind::kGPipe, 2, 2), SimCosts{}).makespan,
              9.0, kTol);
}

// One CPU and no latency: the CPU is never idle, so the step is all the
// work: passes 2 stages x 4 micro-batches x 3, and 4 messages each way of
// 2 ends x 0.25.
TEST(SharedMachinesTest, OnOneCpuWithNoLatencyTheStepIsAllTheWork) {
  const SimMachines machine = OneMachine(2, 1, 0.25);
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneBFlush}) {
    SCOPED_TRACE(ScheduleKindName(kind));
    const SimResult r = Simulate(Params(kind, 2, 4), SimCosts{}, {}, &machine);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_NEAR(r.makespan, 24.0 + 8 * 2 * 0.25, kTol);
  }
}

// With free CPUs a message's ends run one after the other: K = 2, M = 1 on
// two CPUs, 0.3 an end. F0 [0, 1]; the activation's ends [1, 1.6]; stage
// 1's F0 [1.6, 2.6] and B0 [2.6, 4.6]; the gradient's ends [4.6, 5.2];
// stage 0's B0 [5.2, 7.2], as with a latency of 0.6 and no machines. A
// latency longer than that is what counts; one CPU for both runs the same.
TEST(SharedMachinesTest, AMessageArrivesAfterItsEndsAndItsLatency) {
  const ScheduleParams p = Params(ScheduleKind::kGPipe, 2, 1);
  const SimMachines two = OneMachine(2, 2, 0.3);
  SimResult r = Simulate(p, SimCosts{}, {}, &two);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_NEAR(r.makespan, 7.2, kTol);
  SimCosts latency;
  latency.send = 0.6;
  EXPECT_NEAR(Simulate(p, latency).makespan, 7.2, kTol);
  latency.send = 1.0;
  r = Simulate(p, latency, {}, &two);
  EXPECT_NEAR(r.makespan, 6.0 + 2 * 1.0, kTol);
  const SimMachines one = OneMachine(2, 1, 0.3);
  EXPECT_NEAR(Simulate(p, SimCosts{}, {}, &one).makespan, 7.2, kTol);
}

// A stage's own message CPU (SimCosts::activation_message_cpu,
// gradient_message_cpu, by their size) wins over the machine's: K = 2,
// M = 1 on two CPUs, the activation's ends 0.1 each and the gradient's 0.4
// each. F0 [0, 1]; the activation's ends [1, 1.2]; stage 1's F0 [1.2, 2.2]
// and B0 [2.2, 4.2]; the gradient's ends [4.2, 5.0]; stage 0's B0
// [5.0, 7.0]. At the machine's 0.3 an end it was 7.2 (above).
TEST(SharedMachinesTest, AStagesOwnMessageCpuWinsOverTheMachines) {
  const ScheduleParams p = Params(ScheduleKind::kGPipe, 2, 1);
  const SimMachines two = OneMachine(2, 2, 0.3);
  std::vector<SimCosts> costs(2);
  costs[0].activation_message_cpu = 0.1;  // stage 0 sends the activation
  costs[1].gradient_message_cpu = 0.4;    // stage 1 sends the gradient
  SimResult r = Simulate(p, SimCosts{}, costs, &two);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_NEAR(r.makespan, 7.0, kTol);
  // Left unset (< 0), each takes the machine's.
  costs[1].gradient_message_cpu = -1.0;
  r = Simulate(p, SimCosts{}, costs, &two);
  EXPECT_NEAR(r.makespan, 6.0 + 2 * 0.1 + 2 * 0.3, kTol);
  // Not a number: refused.
  costs[1].gradient_message_cpu = std::nan("");
  EXPECT_EQ(Simulate(p, SimCosts{}, costs, &two).status.code(),
            absl::StatusCode::kInvalidArgument);
}

// Three runnable on two CPUs: each at two thirds. GPipe, K = 3, M = 3 (F
// 1, no backward work) on two CPUs: stage 0's F0 [0, 1]; its F1 beside
// stage 1's F0 [1, 2]; then stage 0's F2, stage 1's F1 and stage 2's F0,
// 1 each at 2/3, [2, 3.5]; stage 1's F2 beside stage 2's F1 [3.5, 4.5];
// stage 2's F2 [4.5, 5.5]. Unshared, 5.
TEST(SharedMachinesTest, ThreeRunnableOnTwoCpusShareThem) {
  const ScheduleParams p = Params(ScheduleKind::kGPipe, 3, 3);
  SimCosts forward_only;
  forward_only.backward = 0.0;
  const SimMachines two = OneMachine(3, 2, 0.0);
  const SimResult r = Simulate(p, forward_only, {}, &two);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_NEAR(r.makespan, 5.5, kTol);
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(r.busy[s], 3.5, kTol);
  EXPECT_NEAR(Simulate(p, forward_only).makespan, 5.0, kTol);
}

// Passes far shorter than the clock's rounding at that time (1e-9 units
// after latencies of 1e3) still finish, one after another: the run ends,
// on one CPU, no sooner than the unshared one.
TEST(SharedMachinesTest, PassesBelowTheClocksRoundingStillFinish) {
  SimCosts c;
  c.forward = 1e-9;
  c.backward = 3e-9;
  c.send = 1e3;
  const ScheduleParams p = Params(ScheduleKind::kOneFOneBFlush, 3, 16);
  const SimMachines one = OneMachine(3, 1, 1e-10);
  const SimResult r = Simulate(p, c, {}, &one);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_FALSE(r.deadlock) << r.deadlock_detail;
  EXPECT_GE(r.makespan, Simulate(p, c).makespan);
  EXPECT_LT(r.makespan, 1e6);
}

TEST(SharedMachinesTest, BadMachinesAreInvalidArgument) {
  const ScheduleParams p = Params(ScheduleKind::kGPipe, 2, 2);
  SimMachines machines = OneMachine(2, 1, 0.1);
  machines.machine_of = {0};
  EXPECT_EQ(Simulate(p, SimCosts{}, {}, &machines).status.code(),
            absl::StatusCode::kInvalidArgument);
  machines = OneMachine(2, 1, 0.1);
  machines.machine_of = {0, 1};
  EXPECT_EQ(Simulate(p, SimCosts{}, {}, &machines).status.code(),
            absl::StatusCode::kInvalidArgument);
  machines = OneMachine(2, 0, 0.1);
  EXPECT_EQ(Simulate(p, SimCosts{}, {}, &machines).status.code(),
            absl::StatusCode::kInvalidArgument);
  machines = OneMachine(2, 1, -0.1);
  EXPECT_EQ(Simulate(p, SimCosts{}, {}, &machines).status.code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
