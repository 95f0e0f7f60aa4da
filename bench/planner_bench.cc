// Planner benchmark: 1,000 layers of seeded random costs onto 64 workers of
// mixed speeds in 3 zones (slow links between zones). Times PlanPipeline
// with a free stage count and with all 64 stages, and compares the plans
// with the even split (same stage count for the bottleneck, all 64 workers
// for the step). The last line is one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "scheduler/planner.h"

namespace pipetrain {
namespace {

constexpr int kLayers = 1000;
constexpr int kWorkers = 64;
constexpr int kRuns = 3;

PlanRequest MakeRequest() {
  std::mt19937_64 rng(20240607);
  std::uniform_real_distribution<double> forward(0.5e-3, 4e-3);
  std::uniform_int_distribution<int64_t> activation(1 << 20, 64 << 20);
  std::uniform_int_distribution<int64_t> parameters(1 << 20, 32 << 20);
  PlanRequest request;
  for (int l = 0; l < kLayers; ++l) {
    LayerCost layer;
    layer.forward_seconds = forward(rng);
    layer.backward_seconds = 2.0 * layer.forward_seconds;
    layer.activation_bytes = activation(rng);
    layer.parameter_bytes = parameters(rng);
    request.layers.push_back(layer);
  }
  const double speeds[] = {1.0, 1.0, 2.0, 0.5};
  const char* zones[] = {"us-east", "us-west", "eu"};
  for (int w = 0; w < kWorkers; ++w) {
    PlannerWorker worker;
    worker.id = absl::StrFormat("w%02d", w);
    worker.speed = speeds[w % 4];
    worker.memory_bytes = int64_t{40} << 30;
    worker.zone = zones[(w / 3 + w) % 3];  // interleaved, as a registry lists
    request.workers.push_back(worker);
  }
  request.topology.intra_zone_bandwidth = 50e9;
  request.topology.default_bandwidth = 5e9;
  request.topology.bandwidth[{"us-east", "us-west"}] = 10e9;
  request.micro_batches = 64;
  request.memory = MemoryModel::kOneFOneB;
  return request;
}

struct Timed {
  PipelinePlan plan;
  double seconds = 0.0;  // best of kRuns
};

Timed TimePlan(const PlanRequest& request) {
  Timed timed;
  timed.seconds = 1e30;
  for (int run = 0; run < kRuns; ++run) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
    const std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - start;
    if (!plan.ok()) {
      std::fprintf(stderr, "plan failed: %s\n",
                   plan.status().ToString().c_str());
      std::exit(1);
    }
    timed.seconds = std::min(timed.seconds, took.count());
    timed.plan = *std::move(plan);
  }
  return timed;
}

PipelinePlan EvenSplitPlan(const PlanRequest& request, int stages) {
  absl::StatusOr<PipelinePlan> plan =
      EvaluatePlacement(request, EvenSplit(kLayers, stages));
  if (!plan.ok()) {
    std::fprintf(stderr, "even split: %s\n", plan.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(plan);
}

int Main() {
  PlanRequest request = MakeRequest();
  const Timed free_k = TimePlan(request);
  request.num_stages = kWorkers;
  const Timed fixed_k = TimePlan(request);
  const PipelinePlan even = EvenSplitPlan(request, kWorkers);
  const double bottleneck_ratio =
      fixed_k.plan.bottleneck_seconds / even.bottleneck_seconds;
  const double step_ratio =
      free_k.plan.predicted_step_seconds / even.predicted_step_seconds;
  std::printf("free stage count: %.3f s per plan, %zu stages, step %.1f ms\n",
              free_k.seconds, free_k.plan.stages.size(),
              free_k.plan.predicted_step_seconds * 1e3);
  std::printf(
      "64 stages: %.3f s per plan, bottleneck %.3f ms vs even split %.3f ms "
      "(even split fits memory: %s)\n",
      fixed_k.seconds, fixed_k.plan.bottleneck_seconds * 1e3,
      even.bottleneck_seconds * 1e3, even.fits_memory ? "yes" : "no");
  std::printf(
      "{\"bench\":\"planner\",\"layers\":%d,\"workers\":%d,"
      "\"plan_seconds\":%.4f,\"plan_fixed_stages_seconds\":%.4f,"
      "\"stages\":%zu,\"bottleneck_vs_even_split\":%.4f,"
      "\"step_vs_even_split\":%.4f}\n",
      kLayers, kWorkers, free_k.seconds, fixed_k.seconds,
      free_k.plan.stages.size(), bottleneck_ratio, step_ratio);
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
