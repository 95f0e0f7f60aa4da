#include "scheduler/planner_cost_model.h"

#include <algorithm>
#include <map>
#include <string>

namespace pipetrain {
namespace planner_internal {

StageCostModel::StageCostModel(const PlanRequest& request)
    : num_layers_(static_cast<int>(request.layers.size())),
      micro_batches_(request.micro_batches),
      memory_model_(request.memory),
      state_factor_(2.0 + request.optimizer_state_factor),
      message_overhead_(request.message_overhead_seconds),
      extra_warmup_(std::max(0, request.extra_warmup)) {
  compute_prefix_.assign(num_layers_ + 1, 0.0);
  parameter_prefix_.assign(num_layers_ + 1, 0.0);
  activation_prefix_.assign(num_layers_ + 1, 0.0);
  for (int l = 0; l < num_layers_; ++l) {
    const LayerCost& layer = request.layers[l];
    compute_prefix_[l + 1] =
        compute_prefix_[l] + layer.forward_seconds + layer.backward_seconds;
    parameter_prefix_[l + 1] =
        parameter_prefix_[l] + static_cast<double>(layer.parameter_bytes);
    activation_prefix_[l + 1] =
        activation_prefix_[l] + static_cast<double>(layer.activation_bytes);
    activation_bytes_.push_back(static_cast<double>(layer.activation_bytes));
    activation_wire_.push_back(static_cast<double>(layer.ActivationOnWire()));
    gradient_wire_.push_back(static_cast<double>(layer.GradientOnWire()));
  }
  // Link classes: zones, numbered in order of first appearance among the
  // workers; with measured links every worker is a class of its own (the
  // search then folds over workers instead of zones).
  const bool per_worker = !request.links.empty();
  std::map<std::string, int> zone_index;
  std::vector<const PlannerWorker*> representative;
  for (const PlannerWorker& worker : request.workers) {
    const std::string key = per_worker ? worker.id : worker.zone;
    auto [it, inserted] = zone_index.emplace(key, representative.size());
    if (inserted) representative.push_back(&worker);
    zone_.push_back(it->second);
    speed_.push_back(worker.speed);
    capacity_.push_back(worker.memory_bytes == 0
                            ? kInfinity
                            : static_cast<double>(worker.memory_bytes));
  }
  num_zones_ = static_cast<int>(representative.size());
  seconds_per_byte_.resize(num_zones_ * num_zones_);
  rtt_.resize(num_zones_ * num_zones_);
  for (int a = 0; a < num_zones_; ++a) {
    for (int b = 0; b < num_zones_; ++b) {
      const LinkEstimate link =
          LinkBetween(request, *representative[a], *representative[b]);
      seconds_per_byte_[a * num_zones_ + b] = 1.0 / link.bandwidth_bytes_per_s;
      rtt_[a * num_zones_ + b] = link.rtt_seconds;
    }
  }
}

}  // namespace planner_internal
}  // namespace pipetrain
