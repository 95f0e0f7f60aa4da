// Optimizers (SGD with momentum and weight decay, AdamW) and global
// gradient-norm clipping.
#ifndef PIPETRAIN_WORKER_NN_OPTIMIZER_H_
#define PIPETRAIN_WORKER_NN_OPTIMIZER_H_

#include <memory>
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

  // Optimizer steps taken so far.
  int64_t steps() const { return steps_; }
  float clip_grad_norm() const { return spec_.clip_grad_norm(); }

 private:
  struct State {
    Tensor m;
    Tensor v;
  };
  Optimizer(const v1::OptimizerSpec& spec, Backend* backend)
      : spec_(spec), backend_(backend) {}
  absl::StatusOr<State*> StateFor(Param* param, bool needs_v);

  const v1::OptimizerSpec spec_;
  Backend* const backend_;  // borrowed
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
