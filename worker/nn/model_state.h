// A model's training state in the checkpoint naming and layout: what a
// stage snapshots for a checkpoint and loads when it resumes.
//
// Tensors are named by the model's (global) layer index, so the state of a
// whole model reloads under any partition (pipetrain/v1/stage.proto):
//   layers.{i}.{param}                   a parameter of layer i
//   layers.{i}.{child}.{param}           a composite layer's sub-layer's
//   optimizer.layers.{i}.{param}.{slot}  the optimizer's state for it
// Parameter names per layer kind: linear "weight" [out, in] and "bias"
// [out]; layer_norm "gamma", "beta"; embedding "tokens" [vocab, dim],
// "positions" [max_seq_len, dim]; attention "qkv.*" and "out.*" (two
// linears); transformer_block "ln1.*", "attn.qkv.*", "attn.out.*", "ln2.*",
// "fc1.*", "fc2.*". Optimizer slots: "momentum" (SGD with momentum), "m"
// and "v" (AdamW). A linear weight is stored [in, out] inside the layer and
// transposed on export and import (Param::transposed).
//
// Plain functions and values; the models and optimizer passed in are used by
// the calling thread only (their owner's compute thread).
#ifndef PIPETRAIN_WORKER_NN_MODEL_STATE_H_
#define PIPETRAIN_WORKER_NN_MODEL_STATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/compute/backend.h"
#include "worker/compute/tensor.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"

namespace pipetrain {

// A state tensor's name, parsed.
struct StateName {
  int layer = 0;
  // Within the layer: "weight", "attn.qkv.weight", ...
  std::string param;
  // The optimizer slot; empty for a parameter.
  std::string slot;
};

// Parses a name of the grammar above; InvalidArgument naming it otherwise.
absl::StatusOr<StateName> ParseStateName(absl::string_view name);
// The name of optimizer slot `slot` of the parameter named `param_name`
// ("layers.{i}.{param}").
std::string OptimizerStateName(absl::string_view param_name,
                               absl::string_view slot);

// Training state as host float32 tensors in the checkpoint layout.
struct TrainingState {
  std::map<std::string, Tensor> tensors;
  // Optimizer steps taken (one optimizer per stage: every chunk's).
  int64_t optimizer_steps = 0;
};

// Which tensors a set of model chunks and their optimizer hold: the names,
// checkpoint shapes, and the layers they own. Constant once built.
class StateLayout {
 public:
  StateLayout() = default;
  static StateLayout Of(const std::vector<const Model*>& models,
                        const Optimizer& optimizer);

  // Whether layer `layer` belongs to one of the chunks (its tensors are
  // this layout's; tensors of other layers are not).
  bool OwnsLayer(int layer) const;
  // Sets *owned to whether `name`'s layer is one of the chunks'; for such a
  // tensor returns its checkpoint shape (an empty shape for another layer's).
  // InvalidArgument naming the tensor for a malformed name, or a tensor an
  // owned layer does not have.
  absl::StatusOr<Shape> ShapeOf(absl::string_view name, bool* owned) const;
  // Every tensor (parameters and optimizer slots), by name.
  const std::map<std::string, Shape>& tensors() const { return tensors_; }
  // Parameters only (what a restore must bring).
  const std::vector<std::string>& param_names() const { return params_; }
  // Bytes of every tensor as float32.
  int64_t total_bytes() const { return total_bytes_; }
  const std::vector<std::string>& slot_names() const { return slots_; }

 private:
  std::vector<std::pair<int, int>> ranges_;  // [begin, end) per chunk
  std::map<std::string, Shape> tensors_;
  std::vector<std::string> params_;
  std::vector<std::string> slots_;
  int64_t total_bytes_ = 0;
};

// Host copies of `models`' parameters and `optimizer`'s state for them, in
// the checkpoint layout. Every parameter gets its slots (zeros where the
// optimizer has no state yet, which is what it would start from).
absl::StatusOr<TrainingState> ExportTrainingState(
    const std::vector<const Model*>& models, const Optimizer& optimizer,
    Backend* backend);

// Loads `state` into `models` and `optimizer`: every parameter of the
// models must be there, with its checkpoint shape; the optimizer's slots
// come for every parameter or for none (a fresh optimizer). Tensors of layers
// the models do not hold are ignored. The optimizer's step count becomes
// state.optimizer_steps, or 0 when its slots are all fresh (so that Adam's
// bias correction matches zero moments). Everything is checked before
// anything changes: on error the models and optimizer are as they were.
// InvalidArgument naming the tensor for a missing parameter, a wrong shape,
// an unknown name or a partial set of slots.
absl::Status ImportTrainingState(const TrainingState& state,
                                 const std::vector<Model*>& models,
                                 Optimizer* optimizer, Backend* backend);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_MODEL_STATE_H_
