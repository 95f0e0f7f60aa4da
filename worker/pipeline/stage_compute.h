// StageCompute: the operations of one pipeline stage, one per instruction
// of a schedule (spec/schedule.h): load input, receive / send
// activations and gradients, forward, loss, backward (whole, or split into
// B and W), recompute, optimizer step. It owns what they work on: the
// stage's model chunks, optimizer, loss, weight stash and data (stage 0
// the inputs, the last stage the labels, stage_data.h); the stage executor
// decides which instruction runs when.
//
// Messages carry float32 host tensors; narrowing to the wire dtype is the
// network edge's business. Under the cross-step schedules each forward pins
// the weight version it used and its backward swaps that version back in
// (weight stashing); with vertical sync later stages use stage 0's version
// for a micro-batch, with 2BW every micro-batch of a step uses the step's
// version (StepState::version).
//
// Not thread-safe: owned by the thread that holds the executor's compute
// lock. weight_version() may be read from any thread.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_COMPUTE_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_COMPUTE_H_

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/stage.pb.h"
#include "spec/schedule.h"
#include "worker/compute/backend.h"
#include "worker/nn/loss.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"
#include "worker/pipeline/stage_config.h"
#include "worker/pipeline/stage_data.h"
#include "worker/pipeline/stage_metrics.h"
#include "worker/pipeline/stage_port.h"
#include "worker/pipeline/stage_state.h"
#include "worker/pipeline/weight_stash.h"

namespace pipetrain {

// Options of a stage that are not part of its config.
struct StageOptions {
  // Record in the trace a checksum of the weights every forward and
  // backward ran with (WeightUse::checksum). Costs a pass over the chunk's
  // weights per operation (and a device-to-host copy on a GPU): for tests
  // and debugging.
  bool checksum_weights = false;
};

class StageCompute {
 public:
  // Builds the model chunks (with config.initial_weights when given), the
  // optimizer, the stash (cross-step schedules), the loss (last stage) and
  // the data (StageDataParts: stage 0's inputs, the last stage's labels).
  // `backend`, `metrics` (may be null) and `port` are borrowed and must outlive
  // it.
  static absl::StatusOr<std::unique_ptr<StageCompute>> Create(
      const v1::StageConfig& config, StageSetup setup, Backend* backend,
      StageMetrics* metrics, StagePort* port, const StageOptions& options);

  // Runs `instruction` on `state`, the step its micro-batch belongs to.
  // Forward, backward and B report in *use the weights they ran with.
  absl::Status Execute(const Instruction& instruction, StepState* state,
                       WeightUse* use);
  // Bytes of held weight-gradient operands run through their products so
  // far (Model::weight_grad_bytes_run): the difference across an
  // instruction is what it ran.
  int64_t WeightGradBytesRun() const;

  // The next backward overwrites every gradient instead of accumulating.
  void ZeroGrads() { pipetrain::ZeroGrads(all_params_); }
  // Starts a step's counters (the bytes held across steps carry over).
  void StartStep();
  const StepCounters& counters() const { return counters_; }
  int stash_peak_depth() const {
    return stash_ != nullptr ? stash_->peak_depth() : 0;
  }
  // Cross-step: the pipeline drained; no later micro-batch needs an older
  // version (2BW kept one for a next step, vertical sync a floor).
  void EndRun() {
    if (stash_ != nullptr) stash_->SetFloor(-1);
  }
  // Optimizer steps applied (M per step under 1F1B-async).
  int64_t weight_version() const { return weight_version_.load(); }

  const v1::StageConfig& config() const { return config_; }
  const StageSetup& setup() const { return setup_; }
  Backend* backend() const { return backend_; }
  StagePort* port() const { return port_; }
  int num_chunks() const { return static_cast<int>(models_.size()); }
  const std::vector<std::unique_ptr<Model>>& models() const { return models_; }
  // The one optimizer of every chunk's parameters.
  Optimizer* optimizer() const { return optimizer_.get(); }
  SoftmaxCrossEntropyLoss* loss() const { return loss_.get(); }  // last stage
  // Stage 0 and the last stage (null elsewhere).
  StageData* data() const { return data_.get(); }
  bool is_first() const { return config_.stage() == 0; }
  bool is_last() const { return config_.stage() == config_.num_stages() - 1; }
  // Virtual stage 0 (loads the inputs) and the last one (reads the labels
  // and computes the loss).
  bool IsFirstVirtual(int chunk) const { return is_first() && chunk == 0; }
  bool IsLastVirtual(int chunk) const {
    return is_last() && chunk == num_chunks() - 1;
  }
  // The receiver's chunk of a message virtual stage `chunk` sends down
  // (the same chunk on the next worker, or past the last worker the next
  // chunk on worker 0), and of one it sends up.
  int DownstreamChunk(int chunk) const { return is_last() ? chunk + 1 : chunk; }
  int UpstreamChunk(int chunk) const { return is_first() ? chunk - 1 : chunk; }

  // A backend tensor as a host float32 tensor (the same tensor on the CPU
  // backend), and a host tensor on the backend.
  absl::StatusOr<Tensor> HostCopy(const Tensor& tensor) const;
  absl::StatusOr<Tensor> OnBackend(const Tensor& host) const;

 private:
  StageCompute(const v1::StageConfig& config, StageSetup setup,
               Backend* backend, StageMetrics* metrics, StagePort* port,
               const StageOptions& options);
  absl::Status Build();
  absl::Status LoadInitialWeights();

  MicroBatch& Micro(StepState* state, int mb, int chunk) const;
  // Adds `seconds` to a phase's compute counter.
  void CountCompute(StageMetrics::Phase phase, double seconds) const;
  // Micro-batch mb's forward options (dropout seed) in `step`.
  ForwardOptions MicroBatchOptions(int64_t step, int mb) const;
  // Fills *use with `version` and (when enabled) the chunk's checksum now.
  absl::Status RecordUse(int chunk, int64_t version, WeightUse* use) const;

  absl::Status LoadInput(int mb, StepState* state);
  // With packed weights: when the message a receive is about to wait for
  // is not here yet, lays out now the weights an optimizer step has
  // changed, which the next pass would otherwise do on the step's critical
  // path (Layer::PrepareWeights).
  absl::Status PrepareWhileWaiting(MessageKind kind, int64_t step, int mb,
                                   int chunk);
  absl::Status ReceiveActivation(int mb, int chunk, StepState* state);
  absl::Status Forward(int mb, int chunk, StepState* state, WeightUse* use);
  absl::Status SendActivation(int mb, int chunk, StepState* state);
  absl::Status Loss(int mb, int chunk, StepState* state);
  // The last stage: micro-batch mb's labels (host), read with the step's
  // first, after checking stage 0's split size the micro-batch carries.
  absl::StatusOr<Tensor> Labels(int mb, int chunk, StepState* state);
  absl::Status ReceiveGradient(int mb, int chunk, StepState* state);
  // With every forward of the step run (a drain: nothing waits on this
  // stage but the backward it is about to run), while the gradient a
  // receive waits for is not here after kRunAheadAfter: runs the held
  // weight-gradient products ahead of the optimizer step, one layer at a
  // time while the message stays away, each over at least kRunAheadRows
  // rows not yet run (WeightGradQueue::RunAhead; the same bits). What it
  // runs is counted as the weight pass, W.
  absl::Status RunWeightPassWhileWaiting(int mb, int chunk,
                                         const StepState& state);
  absl::Status Backward(int mb, int chunk, StepState* state, WeightUse* use);
  // Zero-bubble halves of Backward: B keeps in the micro-batch's contexts
  // only what W needs; W frees them.
  absl::Status BackwardInput(int mb, int chunk, StepState* state,
                             WeightUse* use);
  absl::Status BackwardWeight(int mb, int chunk, StepState* state);
  // Re-materialization (when configured): recomputes micro-batch mb's
  // forward contexts from the stage input it kept.
  absl::Status Recompute(int mb, int chunk, const ForwardOptions& options,
                         StepState* state);
  absl::Status SendGradient(int mb, int chunk, StepState* state);
  absl::Status OptimizerStep(StepState* state);
  // The optimizer step without clipping or a weight stash, one layer at a
  // time, last layer first: the layer's held weight-gradient products, its
  // update, then (with packed weights) its forward copies laid out anew,
  // each while the layer's gradient and weights are still in cache. The
  // same bits as flushing every layer, updating every parameter, then
  // packing: each layer's products, update and copy read only its own
  // tensors. The next forward (a first stage's, which has no wait to pack
  // in) then finds its copies current; W^T copies are left to the waits
  // (PrepareWhileWaiting) or the pass that needs them.
  absl::Status UpdateLayerByLayer();
  // Runs the weight-gradient products the models hold back (counted as the
  // weight pass, W).
  absl::Status FlushWeightGrads();
  // Counts a weight pass that ran the held products of `deferred` bytes.
  void CountWeightPass(int64_t deferred, double seconds);
  // Counts an optimizer step (a new weight version) that took `seconds`.
  void CountUpdate(double seconds);
  // Bytes the models' held weight-gradient products keep alive.
  int64_t DeferredBytes() const;

  // Constant after construction.
  const v1::StageConfig config_;
  const StageSetup setup_;
  Backend* const backend_;       // borrowed
  StageMetrics* const metrics_;  // borrowed, may be null
  StagePort* const port_;        // borrowed
  const StageOptions options_;
  // One model per chunk, in chunk order; all_params_ is their parameters
  // in the same order (what the optimizer steps).
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<Param*> all_params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<SoftmaxCrossEntropyLoss> loss_;  // last stage
  std::unique_ptr<StageData> data_;                // stage 0 and the last stage
  std::unique_ptr<WeightStash> stash_;             // cross-step schedules
  bool reuses_weights_ = false;  // Layer::ReuseWeights is on (set by Build)

  StepCounters counters_;
  std::atomic<int64_t> weight_version_{0};
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_COMPUTE_H_
