// StageCostModel: the planner's cost model, shared by the placement search
// and by EvaluatePlacement so that both compute every figure with the same
// floating-point operations (a searched plan re-evaluates to the last bit).
//
// Internal to the planner; callers use scheduler/planner.h.
//
// The model itself is described at the top of planner.cc.
#ifndef PIPETRAIN_SCHEDULER_PLANNER_COST_MODEL_H_
#define PIPETRAIN_SCHEDULER_PLANNER_COST_MODEL_H_

#include <algorithm>
#include <limits>
#include <vector>

#include "scheduler/planner.h"

namespace pipetrain {
namespace planner_internal {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Immutable after construction; thread-compatible (const methods only).
class StageCostModel {
 public:
  // `request` must be valid (see ValidatePlanRequest); it is only read here.
  explicit StageCostModel(const PlanRequest& request);

  int num_layers() const { return num_layers_; }
  int num_workers() const { return static_cast<int>(speed_.size()); }
  int num_zones() const { return num_zones_; }
  int micro_batches() const { return micro_batches_; }
  // The worker's link class ("zone" in the search): its zone when no link
  // was measured, else the worker itself (links are then per pair).
  int zone(int worker) const { return zone_[worker]; }
  double speed(int worker) const { return speed_[worker]; }
  // Seconds per byte there and back between two classes (to rank zone
  // chains).
  double TransferSecondsPerByte(int from, int to) const {
    return seconds_per_byte_[from * num_zones_ + to] +
           seconds_per_byte_[to * num_zones_ + from];
  }
  // One-way latency between two classes: the two directions' RTT / 2,
  // averaged.
  double LatencySeconds(int from, int to) const {
    return 0.25 * (rtt_[from * num_zones_ + to] + rtt_[to * num_zones_ + from]);
  }
  // Seconds per byte from one class to another (1 / bandwidth).
  double SecondsPerByte(int from, int to) const {
    return seconds_per_byte_[from * num_zones_ + to];
  }

  // Forward + backward of layers [begin, end) at speed 1.
  double ReferenceSeconds(int begin, int end) const {
    return compute_prefix_[end] - compute_prefix_[begin];
  }

  // Forward + backward of layers [begin, end) on `worker`, per micro-batch,
  // plus the overhead of the messages it receives (from a stage before it)
  // and sends (to one after it): two per neighbour.
  double ComputeSeconds(int begin, int end, int worker) const {
    const int neighbours = (begin > 0 ? 1 : 0) + (end < num_layers_ ? 1 : 0);
    return (compute_prefix_[end] - compute_prefix_[begin]) / speed_[worker] +
           message_overhead_ * 2 * neighbours;
  }

  // The link's occupancy per micro-batch across the cut before layer `end`,
  // from a worker of class `from` to one of class `to`: activation down and
  // gradient up run in parallel (each direction is its own flow), so the
  // slower of the two.
  double TransferSeconds(int end, int from, int to) const {
    return std::max(
        activation_wire_[end - 1] * seconds_per_byte_[from * num_zones_ + to],
        gradient_wire_[end - 1] * seconds_per_byte_[to * num_zones_ + from]);
  }

  // Bytes a stage of layers [begin, end) needs when `stages_remaining`
  // stages (itself included) follow from it to the end of the pipeline.
  // Inline: the search calls it once per candidate stage.
  double MemoryBytes(int begin, int end, int stages_remaining) const {
    const double params =
        (parameter_prefix_[end] - parameter_prefix_[begin]) * state_factor_;
    const double held = activation_prefix_[end] - activation_prefix_[begin];
    const double input = begin > 0 ? activation_bytes_[begin - 1] : 0.0;
    const double m = micro_batches_;
    switch (memory_model_) {
      case MemoryModel::kGPipe:
        return params + m * (held + input);
      case MemoryModel::kOneFOneB:
        return params +
               (extra_warmup_ > 0
                    ? (stages_remaining - 1.0) * (1 + extra_warmup_) + 1
                    : std::min<double>(m, stages_remaining)) *
                   (held + input);
      case MemoryModel::kRematerialized:
        return params + m * input + held;
    }
    return kInfinity;  // unreachable: the request was validated
  }

  // Transfer of stage s of a well-formed placement (0 for the last).
  double StageTransferSeconds(const std::vector<StageAssignment>& stages,
                              size_t s) const {
    if (s + 1 == stages.size()) return 0.0;
    return TransferSeconds(stages[s].layer_end, zone(stages[s].worker),
                           zone(stages[s + 1].worker));
  }

  // max(compute, transfer) of stage s of a well-formed placement: the same
  // figure EvaluatePlacement and the search form.
  double StageSeconds(const std::vector<StageAssignment>& stages,
                      size_t s) const {
    const StageAssignment& stage = stages[s];
    return std::max(
        ComputeSeconds(stage.layer_begin, stage.layer_end, stage.worker),
        StageTransferSeconds(stages, s));
  }

  // Memory of stage s of a well-formed placement.
  double StageMemoryBytes(const std::vector<StageAssignment>& stages,
                          size_t s) const {
    return MemoryBytes(stages[s].layer_begin, stages[s].layer_end,
                       static_cast<int>(stages.size() - s));
  }

  // The worker's memory in bytes; +infinity when it reported none (0).
  double MemoryCapacity(int worker) const { return capacity_[worker]; }

 private:
  int num_layers_ = 0;
  int num_zones_ = 0;
  int micro_batches_ = 1;
  MemoryModel memory_model_ = MemoryModel::kGPipe;
  double state_factor_ = 1.0;  // 2 + optimizer_state_factor
  double message_overhead_ = 0.0;
  int extra_warmup_ = 0;
  // Prefix sums over layers, index i = sum of layers [0, i). Bytes are kept
  // in double: exact below 2^53 and immune to signed overflow.
  std::vector<double> compute_prefix_;
  std::vector<double> parameter_prefix_;
  std::vector<double> activation_prefix_;
  std::vector<double> activation_bytes_;
  std::vector<double> activation_wire_;  // bytes on the wire, per layer
  std::vector<double> gradient_wire_;
  std::vector<double> speed_;
  std::vector<double> capacity_;
  std::vector<int> zone_;
  std::vector<double> seconds_per_byte_;  // [from * num_zones + to]
  std::vector<double> rtt_;               // [from * num_zones + to]
};

}  // namespace planner_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLANNER_COST_MODEL_H_
