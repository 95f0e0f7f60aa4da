// Layers with explicit forward and backward passes.
//
// A model is a sequence of layers, so no autograd engine is needed: the
// executor calls Forward in order and Backward in reverse. What a forward
// pass must keep for its backward pass lives in a LayerContext owned by the
// caller, so a stage can hold many micro-batches in flight at once (or drop
// them and recompute, for re-materialization).
//
// Thread-compatibility: a layer is used by one thread at a time (the stage's
// compute thread). Parameters are device tensors of the layer's backend.
#ifndef PIPETRAIN_WORKER_NN_LAYER_H_
#define PIPETRAIN_WORKER_NN_LAYER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/compute/tensor.h"
#include "worker/nn/weight_grad_queue.h"

namespace pipetrain {

// A learned tensor and its gradient.
struct Param {
  // Within a layer: "weight", or "child.weight" for a composite layer's
  // sub-layer; a Model prefixes "layers.{i}." (the checkpoint name, see
  // model_state.h).
  std::string name;
  Tensor value;
  Tensor grad;
  // True when `grad` holds nothing yet: the next backward overwrites it
  // instead of accumulating (saves zeroing every step). Set by ZeroGrads.
  bool grad_fresh = true;
  // The value holds the transpose of the checkpoint layout: a linear
  // layer's weight is [in, out] here and [out, in] (as PyTorch's nn.Linear
  // stores it) in checkpoints.
  bool transposed = false;
  // Bumped by every write of `value` (optimizer steps, loads, weight-stash
  // swaps): a copy derived from the value (a layer's packed GEMM operand,
  // Layer::ReuseWeights) is current while this and value's address are
  // unchanged.
  uint64_t version = 0;
};

// What one forward pass saved for its backward pass.
struct LayerContext {
  std::vector<Tensor> saved;
  Shape input_shape;
  // Contexts of sub-layers (composite layers such as a Transformer block).
  std::vector<LayerContext> children;
};

// Which part of a backward pass to run. Zero-bubble schedules split the
// full backward (kFull) into B (kInputOnly: dL/dx, which the previous stage
// waits for) and W (kWeightOnly: the parameter gradients, which can wait).
enum class BackwardMode { kFull, kInputOnly, kWeightOnly };

// Per-call options of a forward pass.
struct ForwardOptions {
  bool training = true;
  // Seeds dropout masks; the executor derives it from (job seed, step,
  // micro-batch) so a recomputed forward draws the same masks.
  uint64_t dropout_seed = 0;
};

// Which packed weight copies Layer::PrepareWeights remakes.
enum class PackedCopies {
  kAll,      // every copy a pass has used
  kForward,  // only those the forward pass reads
};

class Layer {
 public:
  virtual ~Layer() = default;

  // The spec's name of this kind of layer ("linear", "relu", ...).
  virtual std::string_view kind() const = 0;

  // Runs the layer on `x` ([batch, ...]); fills `ctx` with what Backward
  // needs (ctx may be null when no backward will follow).
  virtual absl::StatusOr<Tensor> Forward(const Tensor& x,
                                         const ForwardOptions& options,
                                         LayerContext* ctx) = 0;

  // Given dL/dy, accumulates parameter gradients and returns dL/dx (an empty
  // tensor when `need_dx` is false). `ctx` comes from the matching Forward.
  virtual absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                          const ForwardOptions& options,
                                          LayerContext* ctx, bool need_dx) = 0;

  // The input half of Backward (B): returns dL/dx (empty when `need_dx` is
  // false) and keeps in `ctx` what BackwardWeight needs, dropping what it
  // does not. BackwardInput followed by BackwardWeight on the same `ctx`
  // leaves exactly the gradients Backward would. The default, for layers
  // without parameters, is Backward itself (releasing `ctx`).
  virtual absl::StatusOr<Tensor> BackwardInput(const Tensor& dy,
                                               const ForwardOptions& options,
                                               LayerContext* ctx, bool need_dx);

  // The weight half of Backward (W): accumulates the parameter gradients
  // from what BackwardInput left in `ctx`. The default does nothing.
  virtual absl::Status BackwardWeight(const ForwardOptions& options,
                                      LayerContext* ctx);

  // The layer's parameters (borrowed; owned by the layer).
  virtual std::vector<Param*> params() { return {}; }

  // With `reuse` the layer may keep copies of its weights laid out for its
  // backend's GEMM (Backend::PackOperand), made at first use and remade
  // when a weight's Param::version changes: worth it when the weights
  // multiply many micro-batches between updates (synchronous schedules),
  // a waste when they change every micro-batch. Costs up to two copies of
  // each weight matrix. Off by default; composite layers pass it on.
  virtual void ReuseWeights(bool reuse) { (void)reuse; }

  // With reuse on, remakes now the packed copies that earlier passes used
  // and a weight update has made stale, instead of at the next pass: for a
  // caller with idle time ahead, such as a pipeline stage after its
  // optimizer step, before its next micro-batch arrives. A copy no pass
  // has asked for yet (e.g. W^T of a first layer, whose dx nobody needs)
  // is not made. kForward remakes only the copies the forward pass reads
  // (W, not W^T): for a caller that has just updated the weights and
  // whose next pass is a forward.
  virtual absl::Status PrepareWeights(PackedCopies copies) {
    (void)copies;
    return absl::OkStatus();
  }

  // With a queue, the layer's weight-gradient products go to `queue`
  // (borrowed; outlives its use here), which runs several micro-batches'
  // together (weight_grad_queue.h); the gradients are complete only after
  // the queue's Flush. Null (the default) runs them in every backward.
  // Composite layers pass it on.
  virtual void DeferWeightGrads(WeightGradQueue* queue) { (void)queue; }
};

// Runs the `mode` part of `layer`'s backward pass; kWeightOnly ignores `dy`
// and `need_dx` and returns an empty tensor. For composite layers and
// models that walk their parts in one mode.
absl::StatusOr<Tensor> RunBackward(Layer* layer, BackwardMode mode,
                                   const Tensor& dy,
                                   const ForwardOptions& options,
                                   LayerContext* ctx, bool need_dx);

// Prefixes the names of `layer`'s parameters with "`child`." (a composite
// layer naming its sub-layers' parameters; the names must stay stable, they
// are checkpoint names).
void NameChildParams(Layer* layer, std::string_view child);

// Marks every gradient as empty; the next backward overwrites it.
void ZeroGrads(const std::vector<Param*>& params);

// A 64-bit checksum of the parameters' current values (their bytes, in
// order), for checking which weights an operation really ran with. Device
// values are copied to the host first, so this costs a pass over the
// weights: a verification aid, not something to run on every production
// step.
absl::StatusOr<uint64_t> ParamsChecksum(Backend* backend,
                                        const std::vector<Param*>& params);

// A seed for the random initialization of one layer (or sub-layer), a pure
// function of the job seed and the layer's place, so layer i's weights are
// the same however the model is partitioned.
uint64_t LayerInitSeed(uint64_t seed, int64_t layer_index, int64_t child = 0);

// Creates a parameter of `shape` on `backend` filled with values uniform in
// [-bound, bound] drawn from (init_seed, slot), or with `constant` when bound
// is zero.
absl::StatusOr<Param> MakeParam(Backend* backend, std::string name,
                                const Shape& shape, uint64_t init_seed,
                                int slot, float bound, float constant = 0.0f);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_LAYER_H_
