// Helpers the planner's tests share: layers, workers and stages built in
// one line, and the checks every returned plan must pass. Test-only.
#ifndef PIPETRAIN_SCHEDULER_PLANNER_TEST_UTIL_H_
#define PIPETRAIN_SCHEDULER_PLANNER_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"

namespace pipetrain {
namespace planner_testing {

inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline LayerCost Layer(double forward, double backward, int64_t activation,
                       int64_t parameters) {
  LayerCost layer;
  layer.forward_seconds = forward;
  layer.backward_seconds = backward;
  layer.activation_bytes = activation;
  layer.parameter_bytes = parameters;
  return layer;
}

inline PlannerWorker Worker(std::string id, double speed, int64_t memory,
                            std::string zone) {
  PlannerWorker worker;
  worker.id = std::move(id);
  worker.speed = speed;
  worker.memory_bytes = memory;
  worker.zone = std::move(zone);
  return worker;
}

inline StageAssignment Stage(int begin, int end, int worker) {
  StageAssignment stage;
  stage.layer_begin = begin;
  stage.layer_end = end;
  stage.worker = worker;
  return stage;
}

inline bool Fits(const PlanRequest& request, const PipelinePlan& plan) {
  for (const StageAssignment& stage : plan.stages) {
    const int64_t memory = request.workers[stage.worker].memory_bytes;
    if (memory != 0 && stage.memory_bytes > memory) return false;
  }
  return true;
}

// What every returned plan must satisfy, checked independently of the
// planner's own bookkeeping.
inline void ExpectWellFormed(const PlanRequest& request,
                             const PipelinePlan& plan) {
  ASSERT_FALSE(plan.stages.empty());
  std::vector<bool> used(request.workers.size(), false);
  int begin = 0;
  double bottleneck = 0.0;
  for (const StageAssignment& stage : plan.stages) {
    EXPECT_EQ(stage.layer_begin, begin);
    EXPECT_LT(stage.layer_begin, stage.layer_end);
    ASSERT_GE(stage.worker, 0);
    ASSERT_LT(stage.worker, static_cast<int>(request.workers.size()));
    EXPECT_FALSE(used[stage.worker]) << "worker holds two stages";
    used[stage.worker] = true;
    bottleneck =
        std::max({bottleneck, stage.compute_seconds, stage.transfer_seconds});
    begin = stage.layer_end;
  }
  EXPECT_EQ(begin, static_cast<int>(request.layers.size()));
  EXPECT_EQ(plan.bottleneck_seconds, bottleneck);
  const double k = plan.stages.size();
  EXPECT_DOUBLE_EQ(plan.predicted_step_seconds,
                   (request.micro_batches + k - 1) * bottleneck);
  EXPECT_DOUBLE_EQ(plan.predicted_bubble,
                   (k - 1) / (request.micro_batches + k - 1));
  EXPECT_TRUE(Fits(request, plan));
  EXPECT_TRUE(plan.fits_memory);
}

// ---------------------------------------------------------------------------

}  // namespace planner_testing
}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLANNER_TEST_UTIL_H_
