#include "scheduler/recovery_plan.h"

#include <algorithm>

namespace pipetrain {

int MaxRestarts(const v1::JobSpec& spec) {
  const int n = spec.training().max_restarts();
  if (n < 0) return 0;
  return n == 0 ? 10 : n;
}

std::vector<int> LostStages(
    const v1::Plan& plan, const std::map<std::string, v1::WorkerInfo>& workers,
    const std::string& job_id) {
  std::vector<int> out;
  for (int s = 0; s < plan.stages_size(); ++s) {
    auto w = workers.find(plan.stages(s).worker_id());
    if (w == workers.end() || w->second.state() == v1::WORKER_STATE_LOST ||
        w->second.job_id() != job_id) {
      out.push_back(s);
    }
  }
  return out;
}

bool UnreachableWorkerSettled(
    const std::map<std::string, v1::WorkerInfo>& workers, const std::string& id,
    int64_t since_ms) {
  auto w = workers.find(id);
  return w == workers.end() || w->second.state() == v1::WORKER_STATE_LOST ||
         w->second.last_heartbeat_unix_ms() > since_ms;
}

std::optional<v1::Plan> WithSpares(const v1::Plan& plan,
                                   const std::vector<int>& lost,
                                   const std::vector<v1::WorkerInfo>& spares) {
  if (spares.size() < lost.size()) return std::nullopt;
  v1::Plan out = plan;
  for (size_t i = 0; i < lost.size(); ++i) {
    v1::PlannedStage* s = out.mutable_stages(lost[i]);
    s->set_worker_id(spares[i].id());
    s->set_worker_address(spares[i].address());
    // The downstream stage admits only this identity's Exchange stream.
    s->set_worker_identity(spares[i].identity());
    s->set_memory_limit_bytes(spares[i].memory_bytes());
  }
  return out;
}

std::vector<int> LayersOfStage(const v1::PlannedStage& stage) {
  std::vector<int> out;
  if (stage.chunks_size() == 0) {
    for (int l = stage.layer_begin(); l < stage.layer_end(); ++l) {
      out.push_back(l);
    }
    return out;
  }
  for (const v1::LayerRange& r : stage.chunks()) {
    for (int l = r.begin(); l < r.end(); ++l) out.push_back(l);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<StateTensor> StateForStage(const std::vector<StateTensor>& all,
                                       const v1::StageConfig& config) {
  auto holds = [&config](int layer) {
    if (config.chunks_size() == 0) {
      return layer >= config.layer_begin() && layer < config.layer_end();
    }
    for (const v1::LayerRange& r : config.chunks()) {
      if (layer >= r.begin() && layer < r.end()) return true;
    }
    return false;
  };
  std::vector<StateTensor> out;
  for (const StateTensor& t : all) {
    const std::optional<int> layer = LayerOfStateTensor(t.name);
    if (layer.has_value() && holds(*layer)) out.push_back(t);
  }
  return out;
}

}  // namespace pipetrain
