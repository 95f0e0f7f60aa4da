// Softmax cross-entropy over the last dimension, with accuracy.
#ifndef PIPETRAIN_WORKER_NN_LOSS_H_
#define PIPETRAIN_WORKER_NN_LOSS_H_

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/nn/layer.h"

namespace pipetrain {

// Sums over the rows of one forward call; divide by `rows` for means.
struct LossStats {
  double loss_sum = 0.0;
  double correct = 0.0;
  int64_t rows = 0;

  void Add(const LossStats& other) {
    loss_sum += other.loss_sum;
    correct += other.correct;
    rows += other.rows;
  }
  double mean_loss() const { return rows == 0 ? 0.0 : loss_sum / rows; }
  double accuracy() const { return rows == 0 ? 0.0 : correct / rows; }
};

// Stateless apart from its backend; the per-call probabilities live in the
// caller's LayerContext. Thread-compatible.
class SoftmaxCrossEntropyLoss {
 public:
  explicit SoftmaxCrossEntropyLoss(Backend* backend) : backend_(backend) {}

  // logits [..., C], labels [...] (class ids as floats, one per row).
  // InvalidArgument when shapes disagree or a label is not a class.
  absl::StatusOr<LossStats> Forward(const Tensor& logits, const Tensor& labels,
                                    LayerContext* ctx);
  // dL/dlogits of `scale` * (sum of row losses). For the mean over a
  // mini-batch of N rows split into micro-batches, scale = 1 / N.
  absl::StatusOr<Tensor> Backward(float scale, LayerContext* ctx);

 private:
  Backend* const backend_;  // borrowed
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_LOSS_H_
