// The Fashion-MNIST MLP trained by a scheduler and two workers, each in
// its own network namespace, over every WAN scenario of the network lab
// (wan_cluster.h): the job completes with the loss and test accuracy of the
// in-process reference (the bar the loopback end-to-end tests use), and
// within a generous deadline, so no stream hung on a slow, lossy or
// long link. Prints the round trip the emulator produced and the measured
// step time beside the planner's prediction and the same job on loopback
// (figures, not assertions: timing limits belong to bench_wan).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "common/cpu_quota.h"
#include "gtest/gtest.h"
#include "tests/netlab/require_lab.h"
#include "tests/netlab/wan_cluster.h"
#include "tests/scheduler_cluster.h"

namespace pipetrain::netlab {
namespace {

constexpr int64_t kSteps = 60;
constexpr int64_t kEvalSamples = 2000;
constexpr int kWorkers = 2;
// A step takes well under a second even at the edge's 100 ms round trip;
// a stream that hung would wait for the stages' 60 s receive timeout.
constexpr double kDeadlineSeconds = 150;

v1::JobSpec MlpJob() {
  v1::JobSpec job;
  *job.mutable_training() = testing::MlpSpec(kSteps);
  job.set_num_stages(kWorkers);
  job.set_eval_samples(kEvalSamples);
  return job;
}

// The in-process reference and the loopback cluster's run, once.
struct Baseline {
  testing::ReferenceRun reference;
  JobRun loopback;
};
const Baseline& GetBaseline() {
  static const Baseline* baseline = [] {
    auto* b = new Baseline();
    const v1::JobSpec job = MlpJob();
    b->reference = testing::TrainInProcess(job.training(), -1, kEvalSamples);
    auto cluster = JobCluster::OnLoopback(kWorkers);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) b->loopback = (*cluster)->Run(job, kDeadlineSeconds);
    EXPECT_TRUE(b->loopback.completed) << b->loopback.job.error();
    return b;
  }();
  return *baseline;
}

class WanE2eTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WanE2eTest, TrainsLikeTheReferenceWithinTheDeadline) {
  PIPETRAIN_REQUIRE_LAB();
  const Baseline& baseline = GetBaseline();
  auto scenario = MakeScenario(GetParam(), kWorkers);
  ASSERT_TRUE(scenario.ok()) << scenario.status();
  auto cluster = JobCluster::InScenario(*scenario, kWorkers);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto rtt = (*cluster)->MeasureRtt("w0", "w1");
  ASSERT_TRUE(rtt.ok()) << rtt.status();
  std::string speeds;
  const v1::ListWorkersResponse workers = (*cluster)->Workers();
  for (const v1::WorkerInfo& w : workers.workers()) {
    speeds +=
        absl::StrFormat(" %s %.1f", w.labels().at("zone"), w.gemm_gflops());
  }
  // A worker under a CPU quota reports the cores its cgroup allows, read
  // from the kernel's cgroup files (the lab's quota is share x period);
  // every other worker reports what this test process is allowed (no
  // limit, unless the whole machine runs under one). Its GEMM speed is
  // reported at that share of what its short measurement saw; the speeds
  // are printed, not compared: the workers measure at different moments,
  // and on a loaded machine either may lose most of a core to other
  // processes.
  const double own_limit = CgroupCpuLimit().value_or(0);
  for (const v1::WorkerInfo& w : workers.workers()) {
    const auto share = scenario->cpu_share.find(w.labels().at("zone"));
    double limit = own_limit;
    if (share != scenario->cpu_share.end()) {
      limit =
          own_limit > 0 ? std::min(own_limit, share->second) : share->second;
    }
    EXPECT_NEAR(w.cpu_limit_cores(), limit, 1e-3) << w.id() << speeds;
    EXPECT_GT(w.gemm_gflops(), 0) << w.id() << speeds;
  }

  const v1::JobSpec job = MlpJob();
  const JobRun run = (*cluster)->Run(job, kDeadlineSeconds);
  const std::string counters = (*cluster)->lab()->StopEmulator();
  ASSERT_TRUE(run.submitted.ok()) << run.submitted;
  ASSERT_TRUE(run.completed)
      << GetParam() << ": job " << v1::JobState_Name(run.job.state())
      << " after " << run.wall_seconds << " s at step " << run.job.step()
      << ": " << run.job.error() << "\n"
      << counters;
  EXPECT_EQ(run.job.step(), kSteps);
  const double ref_loss = baseline.reference.losses.back();
  EXPECT_NEAR(run.job.loss(), ref_loss, 1e-5 * ref_loss);
  EXPECT_EQ(run.job.eval().samples(), kEvalSamples);
  EXPECT_NEAR(run.job.eval().accuracy(), baseline.reference.eval.accuracy,
              1e-3);

  std::printf(
      "%s (%s):\n"
      "  GEMM GFLOP/s the workers measured at start:%s\n"
      "  w0 <-> w1 round trip: configured %.1f ms, emulated %.1f ms\n"
      "  step time: measured %.4f s, planner predicted %.4f s, loopback "
      "%.4f s; job %.1f s end to end (loopback %.1f s)\n"
      "  test accuracy %.4f (reference %.4f)\n%s",
      GetParam().c_str(), scenario->description.c_str(), speeds.c_str(),
      scenario->configured_rtt_s * 1e3, *rtt * 1e3, run.step_seconds,
      run.plan.predicted_step_seconds(), baseline.loopback.step_seconds,
      run.wall_seconds, baseline.loopback.wall_seconds,
      run.job.eval().accuracy(), baseline.reference.eval.accuracy,
      counters.c_str());
}

INSTANTIATE_TEST_SUITE_P(Scenarios, WanE2eTest,
                         ::testing::ValuesIn(ScenarioNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace pipetrain::netlab
