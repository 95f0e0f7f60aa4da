// Optimizers (SGD with momentum and weight decay, AdamW) and global
// gradient-norm clipping.
#ifndef PIPETRAIN_WORKER_NN_OPTIMIZER_H_
#define PIPETRAIN_WORKER_NN_OPTIMIZER_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/compute/backend.h"
#include "worker/nn/layer.h"

namespace pipetrain {

// Holds per-parameter state (momentum, Adam moments), keyed by the Param.
// Not thread-safe; owned by the stage's compute thread.
class Optimizer {
 public:
  // InvalidArgument naming the field for a bad spec (no kind set, lr <= 0,
  // beta outside [0, 1), negative weight decay or clip norm).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const v1::OptimizerSpec& spec, Backend* backend);

  // Applies one update from the parameters' gradients, multiplied by
  // `grad_scale` (see ClipScale). Parameters whose gradient is fresh (no
  // backward reached them) are left alone. Marks every gradient fresh.
  absl::Status Step(const std::vector<Param*>& params, float grad_scale = 1.0f);

  // One Step in parts, for a caller that updates its parameters a group at
  // a time (each group while its gradients are in cache): StartStep once,
  // then Update for each group; every parameter in exactly one group.
  // Gives the bits Step gives.
  void StartStep() { ++steps_; }
  absl::Status Update(const std::vector<Param*>& params, float grad_scale);

  // Optimizer steps taken so far.
  int64_t steps() const { return steps_; }
  float clip_grad_norm() const { return spec_.clip_grad_norm(); }

  // Checkpoint support. The per-parameter state tensors ("slots") this
  // optimizer keeps, each of its parameter's shape: "momentum" for SGD with
  // momentum, "m" and "v" (first and second moments) for AdamW, none for
  // plain SGD.
  const std::vector<std::string>& slot_names() const { return slot_names_; }
  // Host copies of `param`'s slots in slot_names() order, in the param's
  // own layout; empty while it has no state (never updated, or fresh).
  absl::StatusOr<std::vector<Tensor>> ExportSlots(const Param& param) const;
  // Replaces `param`'s state with host tensors in slot_names() order (the
  // param's own layout); an empty vector drops it (fresh state, as before
  // the first update). InvalidArgument naming the param for a wrong count
  // or shape.
  absl::Status ImportSlots(const Param& param, const std::vector<Tensor>& host);
  // Sets the step count (Adam's bias correction depends on it).
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  struct State {
    Tensor m;
    Tensor v;
  };
  Optimizer(const v1::OptimizerSpec& spec, Backend* backend);
  absl::StatusOr<State*> StateFor(Param* param, bool needs_v);

  // Constant after construction.
  const v1::OptimizerSpec spec_;
  Backend* const backend_;  // borrowed
  const std::vector<std::string> slot_names_;

  std::unordered_map<const Param*, State> state_;
  int64_t steps_ = 0;
};

// Sum of squares of every non-fresh gradient (one stage's share of the
// global norm; stages add their shares before computing ClipScale).
absl::StatusOr<double> GradSumSquares(Backend* backend,
                                      const std::vector<Param*>& params);

// The factor that brings a gradient of squared norm `sum_squares` to norm at
// most `max_norm` (1 when it already is, or when max_norm <= 0).
float ClipScale(double sum_squares, float max_norm);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_OPTIMIZER_H_
