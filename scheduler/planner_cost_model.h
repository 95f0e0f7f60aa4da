// StageCostModel: the planner's cost model, shared by the placement search
// and by EvaluatePlacement so that both compute every figure with the same
// floating-point operations (a searched plan re-evaluates to the last bit).
//
// Internal to the planner; callers use scheduler/planner.h.
//
// Cost model, per micro-batch:
//  * Compute: worker w runs layer l in (forward_l + backward_l) / speed_w; a
//    stage's compute is the sum over its layers (taken from prefix sums).
//  * Transfer: a stage that is not the last sends its last layer's
//    activation_bytes down and receives the same bytes of gradient back, over
//    Bandwidth(zone of its worker, zone of the next stage's worker):
//    transfer = 2 * bytes / bandwidth.
//  * Stage time = compute + transfer; the bottleneck is the largest.
//  * Memory = parameter bytes * (2 + optimizer_state_factor) for weights,
//    gradients and optimizer state, plus activations. With "held" the sum of
//    the stage's layers' activation_bytes and "input" the bytes entering the
//    stage (activation_bytes of layer begin - 1; 0 for the first stage, whose
//    input is the data batch, not a profiled activation):
//      GPipe:          M * (held + input)
//      1F1B:           min(M, K - s) * (held + input)
//      Rematerialized: M * input + held  (inputs stashed, one mb recomputed)
//    K - s is "stages from s to the end", which a suffix search knows.
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
  int zone(int worker) const { return zone_[worker]; }
  double speed(int worker) const { return speed_[worker]; }
  // 2 / bandwidth between two zones: transfer seconds per activation byte.
  double TransferSecondsPerByte(int from, int to) const {
    return seconds_per_byte_[from * num_zones_ + to];
  }

  // Forward + backward of layers [begin, end) at speed 1.
  double ReferenceSeconds(int begin, int end) const {
    return compute_prefix_[end] - compute_prefix_[begin];
  }

  // Forward + backward of layers [begin, end) on `worker`, per micro-batch.
  double ComputeSeconds(int begin, int end, int worker) const {
    return (compute_prefix_[end] - compute_prefix_[begin]) / speed_[worker];
  }

  // Activation down plus gradient up across the cut before layer `end`,
  // between a worker in zone `from` and one in zone `to`.
  double TransferSeconds(int end, int from, int to) const {
    return activation_bytes_[end - 1] *
           seconds_per_byte_[from * num_zones_ + to];
  }

  // Bytes a stage of layers [begin, end) needs when `stages_remaining`
  // stages (itself included) follow from it to the end of the pipeline.
  double MemoryBytes(int begin, int end, int stages_remaining) const;

  // The worker's memory in bytes; +infinity when it reported none (0).
  double MemoryCapacity(int worker) const { return capacity_[worker]; }

 private:
  int num_layers_ = 0;
  int num_zones_ = 0;
  int micro_batches_ = 1;
  MemoryModel memory_model_ = MemoryModel::kGPipe;
  double state_factor_ = 1.0;  // 2 + optimizer_state_factor
  // Prefix sums over layers, index i = sum of layers [0, i). Bytes are kept
  // in double: exact below 2^53 and immune to signed overflow.
  std::vector<double> compute_prefix_;
  std::vector<double> parameter_prefix_;
  std::vector<double> activation_prefix_;
  std::vector<double> activation_bytes_;
  std::vector<double> speed_;
  std::vector<double> capacity_;
  std::vector<int> zone_;
  std::vector<double> seconds_per_byte_;  // [from * num_zones + to]
};

}  // namespace planner_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLANNER_COST_MODEL_H_
