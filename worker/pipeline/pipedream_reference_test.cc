// The cross-step schedules on K = 2 and 3 stage executors connected in
// memory train exactly like the sequential PipeDream reference
// (pipedream_reference.h): the same loss every step and the same weights,
// for asynchronous 1F1B with and without vertical sync and for 2BW.
#include "worker/pipeline/pipedream_reference.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"
#include "worker/pipeline/in_memory_pipeline.h"

namespace pipetrain {
namespace {

// Relative tolerance on losses and weights; values below kFloor compare
// as if they were kFloor (an absolute 1e-5 * kFloor near zero).
constexpr double kRelative = 1e-5;
constexpr double kFloor = 1e-2;

v1::TrainingSpec CrossStepSpec() {
  v1::TrainingSpec spec = SmallMlpSpec(8, false);
  spec.mutable_optimizer()->set_clip_grad_norm(0);  // not with cross-step
  spec.set_steps(4);
  return spec;
}

bool Close(double got, double want) {
  return std::fabs(got - want) <= kRelative * std::max(std::fabs(want), kFloor);
}

// The largest relative difference between two sets of weights.
double MaxDifference(const std::vector<Tensor>& got,
                     const std::vector<Tensor>& want) {
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const std::vector<float> g = got[i].ToVector();
    const std::vector<float> w = want[i].ToVector();
    for (size_t j = 0; j < std::min(g.size(), w.size()); ++j) {
      worst = std::max(worst, std::fabs(g[j] - w[j]) /
                                  std::max<double>(std::fabs(w[j]), kFloor));
    }
  }
  return worst;
}

void ExpectMatchesPipeDream(const v1::TrainingSpec& spec,
                            const PipeDreamRun& run) {
  auto want = RunPipeDreamReference(spec, run);
  ASSERT_TRUE(want.ok()) << want.status();
  Pipeline p = BuildPipeline(
      spec, run.cuts, run.schedule, run.vertical_sync, {},
      [&run](v1::StageConfig* c) { c->set_extra_warmup(run.extra_warmup); });
  ASSERT_EQ(p.stages.size(), run.cuts.size() + 1);
  ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
  const v1::GetStatusResponse status = p.stages.back()->GetStatus(0);
  ASSERT_EQ(status.results_size(), spec.steps());
  for (int t = 0; t < spec.steps(); ++t) {
    EXPECT_TRUE(Close(status.results(t).loss(), want->losses[t]))
        << "step " << t << ": " << status.results(t).loss() << " vs "
        << want->losses[t];
  }
  const std::vector<Tensor> got = WeightsInOrder(p);
  const std::vector<Tensor>& final_weights = want->weights_after_step.back();
  ASSERT_EQ(got.size(), final_weights.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].shape(), final_weights[i].shape()) << "tensor " << i;
  }
  EXPECT_LE(MaxDifference(got, final_weights), kRelative);
}

TEST(PipeDreamReference, AsyncOneFOneBMatches) {
  for (const std::vector<int>& cuts :
       {std::vector<int>{3}, std::vector<int>{2, 5}}) {
    for (bool vertical_sync : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "K=" << cuts.size() + 1
                                        << " vertical_sync=" << vertical_sync);
      PipeDreamRun run;
      run.schedule = v1::SCHEDULE_ASYNC_1F1B;
      run.vertical_sync = vertical_sync;
      run.cuts = cuts;
      ExpectMatchesPipeDream(CrossStepSpec(), run);
    }
  }
}

TEST(PipeDreamReference, TwoBWMatches) {
  for (const std::vector<int>& cuts :
       {std::vector<int>{3}, std::vector<int>{2, 5}}) {
    SCOPED_TRACE(::testing::Message() << "K=" << cuts.size() + 1);
    PipeDreamRun run;
    run.schedule = v1::SCHEDULE_2BW;
    run.cuts = cuts;
    v1::TrainingSpec spec = CrossStepSpec();
    spec.set_steps(5);
    ExpectMatchesPipeDream(spec, run);
  }
}

// Deeper warm-up (ScheduleParams::extra_warmup): more micro-batches in
// flight per link. Under 1F1B-async each forward then sees an older version
// (g - w_s updates); under 2BW every micro-batch still runs on the version
// of the step before last, so the pipeline matches the same reference.
TEST(PipeDreamReference, DeeperWarmUpMatches) {
  for (auto schedule : {v1::SCHEDULE_ASYNC_1F1B, v1::SCHEDULE_2BW}) {
    for (const std::vector<int>& cuts :
         {std::vector<int>{3}, std::vector<int>{2, 5}}) {
      for (int extra : {1, 3}) {
        // K = 3 warms stage 0 up with 2 (1 + extra) <= M = 8 forwards.
        SCOPED_TRACE(::testing::Message()
                     << v1::ScheduleKindProto_Name(schedule)
                     << " K=" << cuts.size() + 1 << " extra=" << extra);
        PipeDreamRun run;
        run.schedule = schedule;
        run.cuts = cuts;
        run.extra_warmup = extra;
        ExpectMatchesPipeDream(CrossStepSpec(), run);
      }
    }
  }
  // Under 1F1B-async the deeper warm-up is a different training run.
  PipeDreamRun run;
  run.cuts = {2, 5};
  run.schedule = v1::SCHEDULE_ASYNC_1F1B;
  auto plain = RunPipeDreamReference(CrossStepSpec(), run);
  run.extra_warmup = 3;
  auto deeper = RunPipeDreamReference(CrossStepSpec(), run);
  ASSERT_TRUE(plain.ok() && deeper.ok());
  EXPECT_GT(MaxDifference(deeper->weights_after_step.back(),
                          plain->weights_after_step.back()),
            100 * kRelative);
}

// The comparisons can tell the schedules apart: the reference's variants
// end far apart from each other (so matching one is not matching any).
TEST(PipeDreamReference, VariantsDiffer) {
  PipeDreamRun run;
  run.cuts = {2, 5};
  run.schedule = v1::SCHEDULE_ASYNC_1F1B;
  auto plain = RunPipeDreamReference(CrossStepSpec(), run);
  run.vertical_sync = true;
  auto synced = RunPipeDreamReference(CrossStepSpec(), run);
  run.vertical_sync = false;
  run.segment_starts = {2};
  auto drained = RunPipeDreamReference(CrossStepSpec(), run);
  run.segment_starts = {};
  run.schedule = v1::SCHEDULE_2BW;
  auto two_bw = RunPipeDreamReference(CrossStepSpec(), run);
  ASSERT_TRUE(plain.ok() && synced.ok() && drained.ok() && two_bw.ok());
  const auto& w = plain->weights_after_step.back();
  EXPECT_GT(MaxDifference(synced->weights_after_step.back(), w),
            100 * kRelative);
  EXPECT_GT(MaxDifference(drained->weights_after_step.back(), w),
            100 * kRelative);
  EXPECT_GT(MaxDifference(two_bw->weights_after_step.back(), w),
            100 * kRelative);
}

}  // namespace
}  // namespace pipetrain
