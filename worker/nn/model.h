// A built range of a model's layers. Specs are validated by the shape
// rules in spec/model_spec.h, which Build applies first.
//
// A stage of a pipeline holds layers [begin, end) of the spec; the whole
// model is the range [0, layers_size). Initialization depends only on the
// job seed and each layer's index in the spec, so a model gets the same
// weights however it is partitioned.
#ifndef PIPETRAIN_WORKER_NN_MODEL_H_
#define PIPETRAIN_WORKER_NN_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/model.pb.h"
#include "spec/model_spec.h"
#include "worker/compute/backend.h"
#include "worker/nn/layer.h"

namespace pipetrain {

// Layers [begin, end) of a spec, built on one backend.
// Not thread-safe: owned by one compute thread.
class Model {
 public:
  // Validates the spec and the range, then builds the layers.
  static absl::StatusOr<std::unique_ptr<Model>> Build(const v1::ModelSpec& spec,
                                                      int begin, int end,
                                                      Backend* backend,
                                                      uint64_t seed);

  int begin() const { return begin_; }
  int end() const { return end_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  Layer* layer(int i) { return layers_[i].get(); }
  // Per-sample input shape of this range (the spec's output of layer begin-1).
  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return output_shape_; }
  const std::vector<Param*>& params() const { return params_; }
  int64_t num_parameters() const;

  // Runs every layer. `contexts` (resized to num_layers()) receives what
  // Backward needs; null when no backward follows (evaluation).
  absl::StatusOr<Tensor> Forward(const Tensor& x, const ForwardOptions& options,
                                 std::vector<LayerContext>* contexts);
  // Runs every layer backwards from dL/dy; accumulates parameter gradients
  // and returns dL/dx (empty when need_dx is false).
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const ForwardOptions& options,
                                  std::vector<LayerContext>* contexts,
                                  bool need_dx);

  // The split backward of zero-bubble schedules. BackwardInput (B) runs
  // every layer's input half backwards from dL/dy and returns dL/dx (empty
  // when need_dx is false), leaving in `contexts` only what the weight half
  // needs; BackwardWeight (W) then accumulates the parameter gradients from
  // them, layers in reverse order as Backward does. B then W leaves the
  // same gradients as Backward, and W of micro-batches in ascending order
  // accumulates them in the same order too.
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy,
                                       const ForwardOptions& options,
                                       std::vector<LayerContext>* contexts,
                                       bool need_dx);
  absl::Status BackwardWeight(const ForwardOptions& options,
                              std::vector<LayerContext>* contexts);

  // Layer::ReuseWeights on every layer.
  void ReuseWeights(bool reuse) {
    for (auto& layer : layers_) layer->ReuseWeights(reuse);
  }
  // Layer::PrepareWeights on every layer.
  absl::Status PrepareWeights();

  // With `defer`, the weight-gradient products of every layer go through a
  // queue the model owns, which runs several micro-batches' together
  // (weight_grad_queue.h): the gradients are complete only after
  // FlushWeightGrads, which whoever reads them (an optimizer step, a
  // gradient norm) calls first. Worth it when micro-batches are small and
  // several accumulate into one update (synchronous schedules, M > 1).
  void DeferWeightGrads(bool defer);
  // Runs the held products; a no-op when nothing is held or not deferring.
  absl::Status FlushWeightGrads();
  // Runs the held products of the layers that own `params` (some layer's
  // params()), leaving the others held.
  absl::Status FlushWeightGradsFor(const std::vector<Param*>& params);
  // Runs one layer's held products ahead of the flush
  // (WeightGradQueue::RunAhead); false when none did (nothing held, none
  // with `min_rows` rows not yet run, or every layer declined).
  absl::StatusOr<bool> RunWeightGradsAhead(int64_t min_rows);
  // Drops the held products (an abandoned step's).
  void DiscardWeightGrads();
  // Bytes of activations and gradients the held products keep alive.
  int64_t deferred_weight_grad_bytes() const {
    return weight_grads_ != nullptr ? weight_grads_->held_bytes() : 0;
  }
  // Bytes of held operands run through their products so far
  // (WeightGradQueue::run_bytes; 0 when not deferring).
  int64_t weight_grad_bytes_run() const {
    return weight_grads_ != nullptr ? weight_grads_->run_bytes() : 0;
  }

  // Copies of every parameter on the host, in params() order.
  absl::StatusOr<std::vector<Tensor>> ParamsToHost() const;
  // Overwrites the parameters from host tensors of the same shapes.
  absl::Status LoadParams(const std::vector<Tensor>& host);

 private:
  Model(Backend* backend, int begin, int end)
      : backend_(backend), begin_(begin), end_(end) {}
  // Every layer's `mode` part of backward, last layer first.
  absl::StatusOr<Tensor> RunBackwardPass(BackwardMode mode, const Tensor& dy,
                                         const ForwardOptions& options,
                                         std::vector<LayerContext>* contexts,
                                         bool need_dx);
  Backend* const backend_;  // borrowed
  const int begin_;
  const int end_;
  Shape input_shape_;
  Shape output_shape_;
  std::vector<std::unique_ptr<Layer>> layers_;
  // Set while deferring weight-gradient products (DeferWeightGrads).
  std::unique_ptr<WeightGradQueue> weight_grads_;
  std::vector<Param*> params_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_MODEL_H_
