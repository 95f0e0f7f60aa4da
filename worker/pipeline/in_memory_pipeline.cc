#include "worker/pipeline/in_memory_pipeline.h"

#include <cstring>
#include <thread>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/nn/model.h"

namespace pipetrain {

absl::Status InMemoryLink::Send(StageMessage message) {
  for (Tensor& t : message.tensors) {
    Tensor copy = Tensor::Host(t.shape(), t.dtype());
    std::memcpy(copy.raw(), t.raw(), t.bytes());
    t = copy;
  }
  absl::Status valid = to_->ValidateIncoming(message);
  if (!valid.ok()) return valid;
  return to_->mailbox()->Deliver(std::move(message));
}

v1::TrainingSpec SmallMlpSpec(int64_t m, bool remat) {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(test_specs::kSmallMlpTraining, &spec);
  EXPECT_TRUE(status.ok()) << status;
  spec.set_micro_batches(m);
  spec.set_rematerialize(remat);
  return spec;
}

Pipeline BuildPipeline(const v1::TrainingSpec& spec,
                       const std::vector<int>& cuts,
                       v1::ScheduleKindProto schedule, bool vertical_sync,
                       const StageOptions& options, const ConfigEdit& edit) {
  Pipeline p;
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(spec.model().layers_size());
  const int k = static_cast<int>(bounds.size()) - 1;
  for (int s = 0; s < k; ++s) {
    v1::StageConfig config;
    config.set_job_id("job");
    *config.mutable_spec() = spec;
    config.set_stage(s);
    config.set_num_stages(k);
    config.set_layer_begin(bounds[s]);
    config.set_layer_end(bounds[s + 1]);
    config.set_schedule(schedule);
    config.set_vertical_sync(vertical_sync);
    if (s + 1 < k) config.set_downstream("in-memory");
    config.set_recv_timeout_s(30);
    if (edit != nullptr) edit(&config);
    p.backends.push_back(CreateCpuBackend(1));
    p.registries.push_back(std::make_unique<MetricsRegistry>());
    auto metrics = StageMetrics::Create(p.registries.back().get());
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    if (!metrics.ok()) return p;
    p.metrics.push_back(std::move(*metrics));
    auto stage = StageExecutor::Create(config, p.backends.back().get(),
                                       p.metrics.back().get(), options);
    EXPECT_TRUE(stage.ok()) << stage.status();
    if (!stage.ok()) return p;
    p.stages.push_back(std::move(*stage));
  }
  for (int s = 0; s + 1 < k; ++s) {
    p.stages[s]->SetDownstream(
        std::make_shared<InMemoryLink>(p.stages[s + 1].get()));
    p.stages[s + 1]->SetUpstream(
        std::make_shared<InMemoryLink>(p.stages[s].get()));
  }
  return p;
}

Pipeline BuildInterleaved(const v1::TrainingSpec& spec, int k, int v,
                          const std::vector<int>& cuts, bool with_links,
                          const ConfigEdit& edit) {
  Pipeline p;
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(spec.model().layers_size());
  EXPECT_EQ(static_cast<int>(bounds.size()) - 1, k * v);
  for (int s = 0; s < k; ++s) {
    v1::StageConfig config;
    config.set_job_id("job");
    *config.mutable_spec() = spec;
    config.set_stage(s);
    config.set_num_stages(k);
    config.set_schedule(v1::SCHEDULE_INTERLEAVED);
    config.set_virtual_stages(v);
    for (int c = 0; c < v; ++c) {
      v1::LayerRange* range = config.add_chunks();
      range->set_begin(bounds[c * k + s]);
      range->set_end(bounds[c * k + s + 1]);
    }
    config.set_downstream("in-memory");
    config.set_recv_timeout_s(30);
    if (edit != nullptr) edit(&config);
    p.backends.push_back(CreateCpuBackend(1));
    auto stage = StageExecutor::Create(config, p.backends.back().get());
    EXPECT_TRUE(stage.ok()) << stage.status();
    if (!stage.ok()) return p;
    p.stages.push_back(std::move(*stage));
  }
  if (!with_links) return p;
  for (int s = 0; s < k; ++s) {
    StageExecutor* next = p.stages[(s + 1) % k].get();
    p.stages[s]->SetDownstream(std::make_shared<InMemoryLink>(next));
    next->SetUpstream(std::make_shared<InMemoryLink>(p.stages[s].get()));
  }
  return p;
}

absl::Status TrainAll(Pipeline& p, int64_t steps) {
  for (auto& stage : p.stages) {
    absl::Status status = stage->Train(steps).status();
    if (!status.ok()) return status;
  }
  absl::Status first;
  for (auto& stage : p.stages) {
    absl::Status status = stage->Wait();
    if (first.ok()) first = status;
  }
  return first;
}

std::map<std::string, std::vector<float>> WeightsByName(Pipeline& p) {
  std::map<std::string, std::vector<float>> out;
  for (auto& stage : p.stages) {
    auto weights = stage->Weights();
    EXPECT_TRUE(weights.ok()) << weights.status();
    if (!weights.ok()) continue;
    for (const auto& t : weights->weights()) {
      std::vector<float>& values = out[t.name()];
      values.resize(t.data().size() / sizeof(float));
      std::memcpy(values.data(), t.data().data(), t.data().size());
    }
  }
  return out;
}

std::vector<Tensor> WeightsInOrder(Pipeline& p) {
  std::vector<Tensor> out;
  for (auto& stage : p.stages) {
    auto weights = stage->Weights();
    EXPECT_TRUE(weights.ok()) << weights.status();
    if (!weights.ok()) continue;
    for (const auto& t : weights->weights()) {
      Tensor host = Tensor::Host({t.shape().begin(), t.shape().end()});
      std::memcpy(host.raw(), t.data().data(), t.data().size());
      out.push_back(host);
    }
  }
  return out;
}

std::vector<absl::StatusOr<v1::EvalResult>> EvaluateAll(Pipeline& p,
                                                        int64_t max_samples) {
  std::vector<absl::StatusOr<v1::EvalResult>> results(p.stages.size());
  std::vector<std::thread> threads;
  for (size_t s = 0; s < p.stages.size(); ++s) {
    threads.emplace_back([&p, &results, s, max_samples] {
      results[s] = p.stages[s]->Evaluate(max_samples);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace pipetrain
