// Test support: K stage executors connected in memory (no transport), and
// the small job the executor tests train. Test-only (compiled into the
// tests that use it).
#ifndef PIPETRAIN_WORKER_PIPELINE_IN_MEMORY_PIPELINE_H_
#define PIPETRAIN_WORKER_PIPELINE_IN_MEMORY_PIPELINE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics_registry.h"
#include "pipetrain/v1/stage.pb.h"
#include "worker/compute/backend.h"
#include "worker/pipeline/stage_executor.h"
#include "worker/pipeline/stage_metrics.h"

namespace pipetrain {

// Delivers straight into a neighbour's mailbox, after the same validation
// the network edge does. Copies tensors so no storage is shared.
class InMemoryLink : public StageLink {
 public:
  explicit InMemoryLink(StageExecutor* to) : to_(to) {}
  absl::Status Send(StageMessage message) override;

 private:
  StageExecutor* const to_;  // borrowed
};

// A 7-layer MLP (linear, gelu, dropout, layer norm, linear, relu, linear)
// on synthetic data: 1024 training and 64 held-out samples, batches of 32
// in `m` micro-batches, SGD with momentum, the gradient norm clipped at
// 0.5, 6 steps.
v1::TrainingSpec SmallMlpSpec(int64_t m, bool remat);

// Changes a stage's config before it is built (start step, restore, ...).
using ConfigEdit = std::function<void(v1::StageConfig*)>;

struct Pipeline {
  std::vector<std::unique_ptr<Backend>> backends;
  // BuildPipeline's stages report to metrics[s] (a registry of their own).
  std::vector<std::unique_ptr<MetricsRegistry>> registries;
  std::vector<std::unique_ptr<StageMetrics>> metrics;
  std::vector<std::unique_ptr<StageExecutor>> stages;
};

// Cuts the model at `cuts` (layer indices) into stages.
Pipeline BuildPipeline(const v1::TrainingSpec& spec,
                       const std::vector<int>& cuts,
                       v1::ScheduleKindProto schedule = v1::SCHEDULE_GPIPE,
                       bool vertical_sync = false,
                       const StageOptions& options = {},
                       const ConfigEdit& edit = nullptr);

// Interleaved 1F1B: the model is cut at `cuts` into K * v virtual stages;
// worker s holds chunks c = 0..v-1, virtual stage c * K + s. Each worker's
// downstream is the next worker (the last one's wraps to worker 0), its
// upstream the previous one (worker 0's is the last); K = 1 links to itself.
Pipeline BuildInterleaved(const v1::TrainingSpec& spec, int k, int v,
                          const std::vector<int>& cuts, bool with_links = true,
                          const ConfigEdit& edit = nullptr);

// Trains every stage to `steps` and waits; the first failure.
absl::Status TrainAll(Pipeline& p, int64_t steps);

// Every stage's weights by parameter name.
std::map<std::string, std::vector<float>> WeightsByName(Pipeline& p);
// Every stage's weights in stage order, as host tensors (what a whole
// model's LoadParams takes when the stages are not interleaved).
std::vector<Tensor> WeightsInOrder(Pipeline& p);

// Runs one evaluation pass on every stage at once (as the scheduler calls
// them); each stage's answer, in stage order.
std::vector<absl::StatusOr<v1::EvalResult>> EvaluateAll(Pipeline& p,
                                                        int64_t max_samples);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_IN_MEMORY_PIPELINE_H_
