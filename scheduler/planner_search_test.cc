// The planner's search: equal to brute force, better than the even split,
// memory held, and large clusters.
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
#include "scheduler/planner.h"
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

// ---------------------------------------------------------------------------
// Optimality against brute force.

// Calls `visit` with every ordered choice of k distinct workers and every
// cut of `layers` layers into k non-empty ranges.
void ForEachPlacement(
    int layers, int workers, int k,
    const std::function<void(const std::vector<StageAssignment>&)>& visit) {
  std::vector<int> chosen;
  std::vector<bool> taken(workers, false);
  std::function<void()> choose = [&] {
    if (static_cast<int>(chosen.size()) == k) {
      for (uint32_t cuts = 0; cuts < (1u << (layers - 1)); ++cuts) {
        if (__builtin_popcount(cuts) != k - 1) continue;
        std::vector<StageAssignment> stages;
        int begin = 0;
        for (int l = 1; l <= layers; ++l) {
          if (l == layers || (cuts & (1u << (l - 1)))) {
            stages.push_back(Stage(begin, l, chosen[stages.size()]));
            begin = l;
          }
        }
        visit(stages);
      }
      return;
    }
    for (int w = 0; w < workers; ++w) {
      if (taken[w]) continue;
      taken[w] = true;
      chosen.push_back(w);
      choose();
      chosen.pop_back();
      taken[w] = false;
    }
  };
  choose();
}

using ::testing::HasSubstr;

PlanRequest RandomSmallRequest(std::mt19937_64& rng) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto integer = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  PlanRequest request;
  const int layers = integer(2, 7);
  for (int l = 0; l < layers; ++l) {
    const double forward = uniform(0.001, 0.01);
    request.layers.push_back(Layer(forward, forward * uniform(1.0, 3.0),
                                   integer(1, 2000), integer(0, 1000)));
  }
  const int workers = integer(1, 4);
  for (int w = 0; w < workers; ++w) {
    // A third unlimited; the rest between very tight and roomy.
    const int64_t memory = integer(0, 2) == 0 ? 0 : integer(2000, 30000);
    request.workers.push_back(Worker(absl::StrCat("w", w), uniform(0.25, 4.0),
                                     memory, integer(0, 1) ? "a" : "b"));
  }
  request.topology.intra_zone_bandwidth = 2e6;
  request.topology.default_bandwidth = 2e5;
  if (integer(0, 1)) request.topology.bandwidth[{"a", "b"}] = uniform(5e4, 1e6);
  request.micro_batches = integer(1, 8);
  request.memory = static_cast<MemoryModel>(integer(0, 2));
  request.optimizer_state_factor = integer(0, 2);
  return request;
}

struct BruteForce {
  std::vector<double> bottleneck;  // [k], +inf where nothing fits
  double step = kInf;
};

BruteForce SolveByBruteForce(const PlanRequest& request) {
  const int layers = request.layers.size();
  const int workers = request.workers.size();
  BruteForce best;
  best.bottleneck.assign(std::min(layers, workers) + 1, kInf);
  for (int k = 1; k <= std::min(layers, workers); ++k) {
    ForEachPlacement(
        layers, workers, k, [&](const std::vector<StageAssignment>& stages) {
          absl::StatusOr<PipelinePlan> plan =
              EvaluatePlacement(request, stages);
          ASSERT_TRUE(plan.ok()) << plan.status();
          if (!Fits(request, *plan)) return;
          best.bottleneck[k] =
              std::min(best.bottleneck[k], plan->bottleneck_seconds);
          best.step = std::min(best.step, plan->predicted_step_seconds);
        });
  }
  return best;
}

bool NearlyEqual(double a, double b) {
  return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b));
}

TEST(PlanPipelineTest, MatchesBruteForceOnSmallClusters) {
  std::mt19937_64 rng(7);
  int fixed_plans = 0, impossible = 0, free_plans = 0;
  for (int trial = 0; trial < 300; ++trial) {
    PlanRequest request = RandomSmallRequest(rng);
    const BruteForce best = SolveByBruteForce(request);
    for (int k = 1; k < static_cast<int>(best.bottleneck.size()); ++k) {
      request.num_stages = k;
      absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
      if (best.bottleneck[k] == kInf) {
        EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition)
            << "trial " << trial << " k " << k;
        ++impossible;
        continue;
      }
      ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
      ExpectWellFormed(request, *plan);
      EXPECT_EQ(plan->stages.size(), static_cast<size_t>(k));
      EXPECT_TRUE(NearlyEqual(plan->bottleneck_seconds, best.bottleneck[k]))
          << "trial " << trial << " k " << k << ": " << plan->bottleneck_seconds
          << " vs " << best.bottleneck[k];
      ++fixed_plans;
    }
    request.num_stages = 0;
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
    if (best.step == kInf) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
    ExpectWellFormed(request, *plan);
    EXPECT_TRUE(NearlyEqual(plan->predicted_step_seconds, best.step))
        << "trial " << trial << ": " << plan->predicted_step_seconds << " vs "
        << best.step;
    ++free_plans;
  }
  // The random cases must exercise both outcomes, or the test proves little.
  EXPECT_GT(fixed_plans, 300);
  EXPECT_GT(impossible, 30);
  EXPECT_GT(free_plans, 200);
}

// Every subsequence of the workers in their given order, with every cut.
std::vector<std::vector<StageAssignment>> PlacementsAlongGivenOrder(int layers,
                                                                    int workers,
                                                                    int k) {
  std::vector<std::vector<StageAssignment>> placements;
  for (uint32_t set = 0; set < (1u << workers); ++set) {
    if (__builtin_popcount(set) != k) continue;
    std::vector<int> chosen;
    for (int w = 0; w < workers; ++w) {
      if (set & (1u << w)) chosen.push_back(w);
    }
    for (uint32_t cuts = 0; cuts < (1u << (layers - 1)); ++cuts) {
      if (__builtin_popcount(cuts) != k - 1) continue;
      std::vector<StageAssignment> stages;
      int begin = 0;
      for (int l = 1; l <= layers; ++l) {
        if (l == layers || (cuts & (1u << (l - 1)))) {
          stages.push_back(Stage(begin, l, chosen[stages.size()]));
          begin = l;
        }
      }
      placements.push_back(std::move(stages));
    }
  }
  return placements;
}

// Minimum bottleneck per stage count, and minimum step, over placements.
BruteForce BestOf(const PlanRequest& request, bool all_workers_alike) {
  const int layers = request.layers.size();
  const int workers = request.workers.size();
  BruteForce best;
  best.bottleneck.assign(std::min(layers, workers) + 1, kInf);
  for (int k = 1; k <= std::min(layers, workers); ++k) {
    // Alike workers: which ones hold the stages does not matter.
    const int candidates = all_workers_alike ? k : workers;
    for (const auto& stages :
         PlacementsAlongGivenOrder(layers, candidates, k)) {
      absl::StatusOr<PipelinePlan> plan = EvaluatePlacement(request, stages);
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (!plan.ok() || !Fits(request, *plan)) continue;
      best.bottleneck[k] =
          std::min(best.bottleneck[k], plan->bottleneck_seconds);
      best.step = std::min(best.step, plan->predicted_step_seconds);
    }
  }
  return best;
}

PlanRequest RandomLargeRequest(std::mt19937_64& rng, int layers, int workers,
                               bool alike) {
  PlanRequest request = RandomSmallRequest(rng);  // micro-batches, memory...
  request.layers.resize(std::min<size_t>(request.layers.size(), layers));
  while (static_cast<int>(request.layers.size()) < layers) {
    request.layers.push_back(request.layers[rng() % request.layers.size()]);
  }
  std::shuffle(request.layers.begin(), request.layers.end(), rng);
  const PlannerWorker model = request.workers.front();
  request.workers.clear();
  for (int w = 0; w < workers; ++w) {
    PlannerWorker worker = model;
    worker.id = absl::StrCat("w", w);
    if (!alike) {
      worker.speed = 0.25 * (1 + rng() % 12);
      worker.zone = rng() % 3 == 0 ? "b" : "a";
    }
    request.workers.push_back(worker);
  }
  return request;
}

// Above kExactSearchMaxWorkers the search runs over worker orders; with
// alike workers any order is as good as another, so it must be exact.
TEST(PlanPipelineTest, MatchesBruteForceOnLargeClustersOfAlikeWorkers) {
  std::mt19937_64 rng(13);
  int plans = 0;
  for (int trial = 0; trial < 40; ++trial) {
    PlanRequest request =
        RandomLargeRequest(rng, 8 + trial % 6, 8 + trial % 5, /*alike=*/true);
    const BruteForce best = BestOf(request, /*all_workers_alike=*/true);
    for (int k = 1; k < static_cast<int>(best.bottleneck.size()); ++k) {
      request.num_stages = k;
      absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
      if (best.bottleneck[k] == kInf) {
        EXPECT_FALSE(plan.ok()) << "trial " << trial << " k " << k;
        continue;
      }
      ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
      ExpectWellFormed(request, *plan);
      EXPECT_TRUE(NearlyEqual(plan->bottleneck_seconds, best.bottleneck[k]))
          << "trial " << trial << " k " << k << ": " << plan->bottleneck_seconds
          << " vs " << best.bottleneck[k];
      ++plans;
    }
    request.num_stages = 0;
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
    if (best.step == kInf) continue;
    ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
    EXPECT_TRUE(NearlyEqual(plan->predicted_step_seconds, best.step))
        << "trial " << trial << ": " << plan->predicted_step_seconds << " vs "
        << best.step;
  }
  EXPECT_GT(plans, 100);
}

// With unlike workers the orders are heuristics, but the given order is
// one of them: no placement along it may beat the plan.
TEST(PlanPipelineTest, NoPlacementAlongTheGivenOrderBeatsTheLargeClusterPlan) {
  std::mt19937_64 rng(17);
  int plans = 0;
  for (int trial = 0; trial < 20; ++trial) {
    PlanRequest request =
        RandomLargeRequest(rng, 5 + trial % 4, 8 + trial % 3, /*alike=*/false);
    const BruteForce best = BestOf(request, /*all_workers_alike=*/false);
    for (int k = 1; k < static_cast<int>(best.bottleneck.size()); ++k) {
      if (best.bottleneck[k] == kInf) continue;
      request.num_stages = k;
      absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
      ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
      ExpectWellFormed(request, *plan);
      EXPECT_LE(plan->bottleneck_seconds, best.bottleneck[k] * (1 + 1e-12))
          << "trial " << trial << " k " << k;
      ++plans;
    }
    if (best.step == kInf) continue;
    request.num_stages = 0;
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
    ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
    EXPECT_LE(plan->predicted_step_seconds, best.step * (1 + 1e-12))
        << "trial " << trial;
  }
  EXPECT_GT(plans, 50);
}

TEST(PlanPipelineTest, EqualStepTimesPreferFewerStages) {
  PlanRequest request;
  // Nothing crosses a cut, so with one micro-batch one stage of 2 layers
  // and two stages of one take exactly the same step.
  request.layers = {Layer(0.25, 0.5, 0, 0), Layer(0.25, 0.5, 0, 0)};
  request.workers = {Worker("a", 1.0, 0, "z"), Worker("b", 1.0, 0, "z")};
  request.micro_batches = 1;
  absl::StatusOr<PipelinePlan> two =
      EvaluatePlacement(request, EvenSplit(2, 2));
  ASSERT_TRUE(two.ok()) << two.status();
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->predicted_step_seconds, two->predicted_step_seconds);
  EXPECT_EQ(plan->stages.size(), 1u);
}

// ---------------------------------------------------------------------------
// Behaviour a user would check.

// Twelve layers of uneven cost whose outputs are large except after layer 5.
// Workers listed zone-interleaved: fast-a, slow-b (4x slower), fast-a,
// fast-b; the a-b link is slow.
PlanRequest UnevenRequest() {
  PlanRequest request;
  const double forward[] = {0.02, 0.06, 0.03, 0.01, 0.05, 0.03,
                            0.04, 0.02, 0.06, 0.01, 0.03, 0.02};
  for (int l = 0; l < 12; ++l) {
    const int64_t activation = l == 5 ? kMiB : 256 * kMiB;
    request.layers.push_back(
        Layer(forward[l], 2 * forward[l], activation, 64 * kMiB));
  }
  request.workers = {Worker("a0", 1.0, 0, "a"), Worker("b-slow", 0.25, 0, "b"),
                     Worker("a1", 1.0, 0, "a"), Worker("b1", 1.0, 0, "b")};
  request.topology.intra_zone_bandwidth = 50e9;
  request.topology.default_bandwidth = 0.5e9;  // 0.54 s per big cut
  request.micro_batches = 8;
  request.num_stages = 4;
  return request;
}

TEST(PlanPipelineTest, BeatsTheEvenSplitOnUnevenLayersAndWorkers) {
  const PlanRequest request = UnevenRequest();
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(request, *plan);
  absl::StatusOr<PipelinePlan> even =
      EvaluatePlacement(request, EvenSplit(12, 4));
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_LT(plan->bottleneck_seconds, 0.5 * even->bottleneck_seconds)
      << plan->explanation << "\nvs even split\n"
      << even->explanation;

  // The slow worker gets fewer layers than any fast one.
  int slow_layers = 0, fewest_fast_layers = 12;
  for (const StageAssignment& stage : plan->stages) {
    const int count = stage.layer_end - stage.layer_begin;
    if (stage.worker == 1) {
      slow_layers = count;
    } else {
      fewest_fast_layers = std::min(fewest_fast_layers, count);
    }
  }
  EXPECT_LT(slow_layers, fewest_fast_layers) << plan->explanation;

  // The slow link is crossed once, where the activation is small.
  int crossings = 0;
  for (size_t s = 0; s + 1 < plan->stages.size(); ++s) {
    const StageAssignment& stage = plan->stages[s];
    if (request.workers[stage.worker].zone ==
        request.workers[plan->stages[s + 1].worker].zone) {
      continue;
    }
    ++crossings;
    EXPECT_EQ(stage.layer_end, 6) << plan->explanation;
  }
  EXPECT_EQ(crossings, 1) << plan->explanation;
}

TEST(PlanPipelineTest, ChoosesTheStageCountByStepTime) {
  PlanRequest request;
  for (int l = 0; l < 16; ++l) {
    request.layers.push_back(Layer(0.01, 0.02, kMiB, kMiB));
  }
  for (int w = 0; w < 4; ++w) {
    request.workers.push_back(Worker(absl::StrCat("w", w), 1.0, 0, "z"));
  }
  // One micro-batch: a pipeline only adds transfers and bubble.
  request.micro_batches = 1;
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages.size(), 1u) << plan->explanation;
  // Many micro-batches: every worker pays off.
  request.micro_batches = 64;
  plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages.size(), 4u) << plan->explanation;
  ExpectWellFormed(request, *plan);
}

TEST(PlanPipelineTest, MemoryLimitsForceMoreStages) {
  PlanRequest request;
  for (int l = 0; l < 9; ++l) {
    request.layers.push_back(Layer(0.01, 0.02, kMiB, 100 * kMiB));
  }
  // 9 layers * 300 MiB of weights, gradients and state: three per 1 GiB
  // worker, although one stage would be fastest (M = 1).
  for (int w = 0; w < 4; ++w) {
    request.workers.push_back(Worker(absl::StrCat("w", w), 1.0, kGiB, "z"));
  }
  request.micro_batches = 1;
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(request, *plan);
  EXPECT_EQ(plan->stages.size(), 3u) << plan->explanation;
}

TEST(PlanPipelineTest, MemoryHoldsOnEveryStageOfRandomPlans) {
  std::mt19937_64 rng(11);
  int plans = 0;
  for (int trial = 0; trial < 40; ++trial) {
    PlanRequest request;
    const int layers = 20 + trial;
    for (int l = 0; l < layers; ++l) {
      request.layers.push_back(
          Layer(0.001 * (1 + rng() % 10), 0.002 * (1 + rng() % 10),
                int64_t(1 + rng() % 64) * kMiB, int64_t(rng() % 64) * kMiB));
    }
    const int workers = 2 + trial % 10;  // both searches
    for (int w = 0; w < workers; ++w) {
      request.workers.push_back(
          Worker(absl::StrCat("w", w), 0.5 + 0.25 * (rng() % 6),
                 int64_t(1 + rng() % 8) * kGiB, rng() % 2 ? "a" : "b"));
    }
    request.micro_batches = 1 + rng() % 16;
    request.memory = static_cast<MemoryModel>(trial % 3);
    request.num_stages = trial % 4 == 0 ? 2 : 0;
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    ExpectWellFormed(request, *plan);
    ++plans;
  }
  EXPECT_GT(plans, 20);
}

// ---------------------------------------------------------------------------
// Large clusters (heuristic worker orders).

TEST(PlanPipelineTest, LargeClusterGroupsZonesToCrossTheSlowLinkOnce) {
  PlanRequest request;
  for (int l = 0; l < 64; ++l) {
    // Small outputs only every 8 layers, where a cut is cheap anywhere.
    const int64_t activation = l % 8 == 7 ? kMiB : 512 * kMiB;
    request.layers.push_back(Layer(0.01, 0.02, activation, kMiB));
  }
  for (int w = 0; w < 16; ++w) {
    request.workers.push_back(
        Worker(absl::StrCat("w", w), 1.0, 0, w % 2 ? "east" : "west"));
  }
  request.topology.intra_zone_bandwidth = 100e9;
  request.topology.default_bandwidth = 1e9;
  request.micro_batches = 32;
  request.num_stages = 16;
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(request, *plan);
  int crossings = 0;
  for (size_t s = 0; s + 1 < plan->stages.size(); ++s) {
    if (request.workers[plan->stages[s].worker].zone !=
        request.workers[plan->stages[s + 1].worker].zone) {
      ++crossings;
    }
  }
  EXPECT_EQ(crossings, 1) << plan->explanation;
  absl::StatusOr<PipelinePlan> even =
      EvaluatePlacement(request, EvenSplit(64, 16));
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_LT(plan->bottleneck_seconds, 0.5 * even->bottleneck_seconds)
      << plan->explanation;
}

TEST(PlanPipelineTest, PlansAThousandLayersOnSixtyFourWorkers) {
  std::mt19937_64 rng(3);
  PlanRequest request;
  for (int l = 0; l < 1000; ++l) {
    request.layers.push_back(
        Layer(1e-3 * (1 + rng() % 8), 2e-3 * (1 + rng() % 8),
              int64_t(1 + rng() % 64) * kMiB, int64_t(1 + rng() % 32) * kMiB));
  }
  const char* zones[] = {"a", "b", "c"};
  for (int w = 0; w < 64; ++w) {
    request.workers.push_back(Worker(absl::StrCat("w", w),
                                     w % 4 == 3 ? 0.5 : 1.0 + (w % 4 == 2),
                                     96 * kGiB, zones[(w + w / 3) % 3]));
  }
  request.topology.default_bandwidth = 5e9;
  request.topology.intra_zone_bandwidth = 50e9;
  request.micro_batches = 64;
  request.memory = MemoryModel::kOneFOneB;
  for (int stages : {0, 64}) {
    request.num_stages = stages;
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectWellFormed(request, *plan);
    // The even split is one of the placements searched (the given order).
    absl::StatusOr<PipelinePlan> even =
        EvaluatePlacement(request, EvenSplit(1000, 64));
    ASSERT_TRUE(even.ok()) << even.status();
    ASSERT_TRUE(even->fits_memory);
    EXPECT_LE(plan->predicted_step_seconds, even->predicted_step_seconds);
    if (stages > 0) {
      EXPECT_EQ(plan->stages.size(), 64u);
      EXPECT_LE(plan->bottleneck_seconds, even->bottleneck_seconds);
    }
  }
}

}  // namespace
}  // namespace pipetrain
