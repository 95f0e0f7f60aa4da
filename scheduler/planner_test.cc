// The planner: its cost model by hand and its handling of bad requests.
#include "scheduler/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/planner_test_util.h"

namespace pipetrain {
namespace {

using planner_testing::ExpectWellFormed;
using planner_testing::Fits;
using planner_testing::kGiB;
using planner_testing::kInf;
using planner_testing::kMiB;
using planner_testing::Layer;
using planner_testing::Stage;
using planner_testing::Worker;
using ::testing::HasSubstr;

// The cost model, by hand.

TEST(TopologyTest, BandwidthLooksUpUnorderedPairsThenDefaults) {
  Topology topology;
  topology.intra_zone_bandwidth = 100.0;
  topology.default_bandwidth = 10.0;
  topology.bandwidth[{"a", "b"}] = 5.0;
  topology.bandwidth[{"c", "c"}] = 50.0;
  EXPECT_EQ(topology.Bandwidth("a", "b"), 5.0);
  EXPECT_EQ(topology.Bandwidth("b", "a"), 5.0);
  EXPECT_EQ(topology.Bandwidth("a", "a"), 100.0);
  EXPECT_EQ(topology.Bandwidth("c", "c"), 50.0);
  EXPECT_EQ(topology.Bandwidth("a", "c"), 10.0);
}

TEST(EvenSplitTest, SplitsByCountWithTheRemainderUpFront) {
  const std::vector<StageAssignment> stages = EvenSplit(10, 3);
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages[0].layer_begin, 0);
  EXPECT_EQ(stages[0].layer_end, 4);
  EXPECT_EQ(stages[1].layer_end, 7);
  EXPECT_EQ(stages[2].layer_end, 10);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(stages[k].worker, k);
  EXPECT_TRUE(EvenSplit(2, 3).empty());
  EXPECT_TRUE(EvenSplit(5, 0).empty());
}

// Two stages: layers [0, 2) on a worker of speed 2 in zone a, layer 2 on a
// worker of speed 1 in zone b; 1 MB/s between zones.
PlanRequest HandRequest(MemoryModel memory) {
  PlanRequest request;
  request.layers = {Layer(0.010, 0.020, 1000, 100),
                    Layer(0.030, 0.060, 2000, 200),
                    Layer(0.005, 0.010, 4000, 400)};
  request.workers = {Worker("w0", 2.0, 0, "a"), Worker("w1", 1.0, 0, "b")};
  request.topology.default_bandwidth = 1e6;
  request.micro_batches = 4;
  request.memory = memory;
  request.optimizer_state_factor = 1.0;
  return request;
}

TEST(EvaluatePlacementTest, MatchesTheCostModelByHand) {
  const PlanRequest request = HandRequest(MemoryModel::kGPipe);
  absl::StatusOr<PipelinePlan> plan =
      EvaluatePlacement(request, {Stage(0, 2, 0), Stage(2, 3, 1)});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& stages = plan->stages;
  // Compute comes from prefix sums: exact up to rounding of the total.
  constexpr double kTolerance = 1e-15;
  EXPECT_NEAR(stages[0].compute_seconds, 0.120 / 2.0, kTolerance);
  // The link's occupancy: activation down and gradient up (2000 bytes
  // each at 1 MB/s) run in parallel.
  EXPECT_DOUBLE_EQ(stages[0].transfer_seconds, 2000 / 1e6);
  EXPECT_NEAR(stages[1].compute_seconds, 0.015, kTolerance);
  EXPECT_EQ(stages[1].transfer_seconds, 0.0);
  // GPipe: params * (2 + 1) + M * (held + input).
  EXPECT_EQ(stages[0].memory_bytes, 300 * 3 + 4 * (3000 + 0));
  EXPECT_EQ(stages[1].memory_bytes, 400 * 3 + 4 * (4000 + 2000));
  EXPECT_EQ(plan->bottleneck_stage, 0);
  // max(compute, transfer): the transfer overlaps other micro-batches.
  EXPECT_NEAR(plan->bottleneck_seconds, 0.060, kTolerance);
  EXPECT_NEAR(plan->predicted_step_seconds, 5 * 0.060, 5 * kTolerance);
  EXPECT_DOUBLE_EQ(plan->predicted_bubble, 1.0 / 5.0);
}

TEST(EvaluatePlacementTest, MemoryModelsByHand) {
  const std::vector<StageAssignment> placement = {Stage(0, 2, 0),
                                                  Stage(2, 3, 1)};
  absl::StatusOr<PipelinePlan> one_f_one_b =
      EvaluatePlacement(HandRequest(MemoryModel::kOneFOneB), placement);
  ASSERT_TRUE(one_f_one_b.ok()) << one_f_one_b.status();
  // min(M = 4, K - s): 2 micro-batches on stage 0, 1 on stage 1.
  EXPECT_EQ(one_f_one_b->stages[0].memory_bytes, 900 + 2 * 3000);
  EXPECT_EQ(one_f_one_b->stages[1].memory_bytes, 1200 + 1 * 6000);
  absl::StatusOr<PipelinePlan> remat =
      EvaluatePlacement(HandRequest(MemoryModel::kRematerialized), placement);
  ASSERT_TRUE(remat.ok()) << remat.status();
  // M * input + one micro-batch's activations.
  EXPECT_EQ(remat->stages[0].memory_bytes, 900 + 4 * 0 + 3000);
  EXPECT_EQ(remat->stages[1].memory_bytes, 1200 + 4 * 2000 + 4000);
}

TEST(EvaluatePlacementTest, ReportsOverflowInsteadOfFailing) {
  PlanRequest request = HandRequest(MemoryModel::kGPipe);
  request.workers[1].memory_bytes = 1000;  // stage 1 needs 25,200
  absl::StatusOr<PipelinePlan> plan =
      EvaluatePlacement(request, {Stage(0, 2, 0), Stage(2, 3, 1)});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits_memory);
}

TEST(EvaluatePlacementTest, ExplanationHasOneLinePerStageAndASummary) {
  PlanRequest request = HandRequest(MemoryModel::kGPipe);
  request.workers[1].memory_bytes = 64 * kMiB;
  absl::StatusOr<PipelinePlan> plan =
      EvaluatePlacement(request, {Stage(0, 2, 0), Stage(2, 3, 1)});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<std::string> lines =
      absl::StrSplit(plan->explanation, '\n');
  ASSERT_EQ(lines.size(), 3u) << plan->explanation;
  EXPECT_EQ(lines[0],
            "stage 0: layers [0, 2) on worker w0 (zone a): compute 60.000 ms "
            "| transfer 2.000 ms + latency 0.000 ms, memory 0.0 MiB of "
            "unlimited");
  EXPECT_EQ(lines[1],
            "stage 1: layers [2, 3) on worker w1 (zone b): compute 15.000 ms "
            "| transfer 0.000 ms + latency 0.000 ms, memory 0.0 MiB of 64.0 "
            "MiB");
  EXPECT_EQ(lines[2],
            "bottleneck: stage 0 (60.000 ms); (M + K - 1) x bottleneck "
            "300.000 ms; bubble 20.0%");
}

TEST(EvaluatePlacementTest, RejectsMalformedPlacements) {
  const PlanRequest request = HandRequest(MemoryModel::kGPipe);
  const std::vector<std::vector<StageAssignment>> malformed = {
      {},                                // no stages
      {Stage(0, 2, 0)},                  // does not reach the end
      {Stage(1, 3, 0)},                  // does not start at 0
      {Stage(0, 2, 0), Stage(1, 3, 1)},  // overlap
      {Stage(0, 1, 0), Stage(2, 3, 1)},  // gap
      {Stage(0, 2, 0), Stage(2, 2, 1), Stage(2, 3, 1)},  // empty stage
      {Stage(0, 2, 0), Stage(2, 3, 0)},  // one worker, two stages
      {Stage(0, 2, 0), Stage(2, 3, 2)},  // no such worker
      {Stage(0, 2, -1), Stage(2, 3, 1)},
      {Stage(0, 4, 0)},  // past the last layer
  };
  for (size_t i = 0; i < malformed.size(); ++i) {
    EXPECT_EQ(EvaluatePlacement(request, malformed[i]).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "case " << i;
  }
}

// ---------------------------------------------------------------------------
// Malformed and impossible requests.

PlanRequest SmallRequest() {
  PlanRequest request;
  for (int l = 0; l < 6; ++l) {
    request.layers.push_back(Layer(0.01, 0.02, 1000, 1000));
  }
  request.workers = {Worker("a", 1.0, 0, "z"), Worker("b", 1.0, 0, "z"),
                     Worker("c", 1.0, 0, "z")};
  request.micro_batches = 4;
  return request;
}

TEST(PlanPipelineTest, RejectsMalformedRequests) {
  const std::vector<std::function<void(PlanRequest&)>> breakers = {
      [](PlanRequest& r) { r.layers.clear(); },
      [](PlanRequest& r) { r.workers.clear(); },
      [](PlanRequest& r) { r.workers[1].speed = 0.0; },
      [](PlanRequest& r) { r.workers[1].speed = -1.0; },
      [](PlanRequest& r) { r.workers[1].speed = kInf; },
      [](PlanRequest& r) { r.workers[1].memory_bytes = -1; },
      [](PlanRequest& r) { r.workers[2].id = r.workers[0].id; },
      [](PlanRequest& r) { r.layers[2].forward_seconds = -0.1; },
      [](PlanRequest& r) { r.layers[2].backward_seconds = std::nan(""); },
      [](PlanRequest& r) { r.layers[2].activation_bytes = -1; },
      [](PlanRequest& r) { r.layers[2].parameter_bytes = -1; },
      [](PlanRequest& r) { r.micro_batches = 0; },
      [](PlanRequest& r) { r.num_stages = -1; },
      [](PlanRequest& r) { r.optimizer_state_factor = -1.0; },
      [](PlanRequest& r) { r.topology.intra_zone_bandwidth = 0.0; },
      [](PlanRequest& r) { r.topology.default_bandwidth = -5.0; },
      [](PlanRequest& r) {
        r.topology.bandwidth[{"z", "y"}] = 0.0;
      },
      [](PlanRequest& r) {
        r.topology.bandwidth[{"z", "y"}] = 1.0;
        r.topology.bandwidth[{"y", "z"}] = 2.0;
      },
      [](PlanRequest& r) { r.memory = static_cast<MemoryModel>(7); },
  };
  ASSERT_TRUE(PlanPipeline(SmallRequest()).ok());
  for (size_t i = 0; i < breakers.size(); ++i) {
    PlanRequest request = SmallRequest();
    breakers[i](request);
    EXPECT_EQ(PlanPipeline(request).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "case " << i;
    EXPECT_EQ(EvaluatePlacement(request, EvenSplit(6, 2)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "case " << i;
  }
}

TEST(PlanPipelineTest, TooFewWorkersOrLayersForTheStageCount) {
  PlanRequest request = SmallRequest();
  request.num_stages = 4;
  absl::Status status = PlanPipeline(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("needs 4 workers, only 3"));

  request.layers.resize(2);
  request.num_stages = 3;
  status = PlanPipeline(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("only 2"));
}

TEST(PlanPipelineTest, ALayerTooLargeForEveryWorkerIsNamed) {
  PlanRequest request = SmallRequest();
  for (PlannerWorker& worker : request.workers) worker.memory_bytes = 8 * kGiB;
  request.layers[3].parameter_bytes = 3 * kGiB;  // * (2 + 1) > 8 GiB
  const absl::Status status = PlanPipeline(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("layer 3 alone needs 9.0 GiB"));
  EXPECT_THAT(status.message(), HasSubstr("largest worker has 8.0 GiB"));
}

TEST(PlanPipelineTest, TooLittleMemoryInTotalIsExplained) {
  PlanRequest request = SmallRequest();
  // Weights, gradients and state take 3,000 bytes a layer, activations
  // 4 * 1,000 a layer plus 4 * 1,000 of input after the first stage: three
  // layers fit only as the first stage (21,000), two elsewhere (18,000), so
  // six layers need three workers.
  for (PlannerWorker& worker : request.workers) worker.memory_bytes = 24000;
  request.num_stages = 2;
  absl::Status status = PlanPipeline(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no placement fits in memory"));

  request.workers.resize(2);
  request.num_stages = 0;
  status = PlanPipeline(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no placement fits in memory"));
}

TEST(PlanPipelineTest, WeightsBeyondAllMemoryTogetherAreExplained) {
  PlanRequest request = SmallRequest();
  for (PlannerWorker& worker : request.workers) worker.memory_bytes = kGiB;
  // 6 layers * 200 MiB * (2 + 1): 3.5 GiB of state on 3 GiB of workers,
  // although each layer alone (600 MiB) fits anywhere.
  for (LayerCost& layer : request.layers) layer.parameter_bytes = 200 * kMiB;
  const absl::Status status = PlanPipeline(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("need 3.5 GiB but all 3 workers together have 3.0"));
}

TEST(PlanPipelineTest, RefusesSearchesTooLargeToHold) {
  PlanRequest request = SmallRequest();
  request.layers.resize(100000, request.layers.front());
  request.workers.clear();
  for (int w = 0; w < 64; ++w) {
    request.workers.push_back(Worker(absl::StrCat("w", w), 1.0, 0, "z"));
  }
  EXPECT_EQ(PlanPipeline(request).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pipetrain
