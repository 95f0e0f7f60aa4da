// StageExecutor: one stage of a pipeline, transport-free.
//
// Configured with a StageConfig (layers [begin, end) of a job's model, its
// place in the pipeline, the schedule), it runs the schedule's instruction
// stream once per step on its own thread: receiving activations and
// gradients from its Mailbox, sending its own through StageLinks, and
// applying the optimizer where the schedule says. Stage 0 reads the data;
// labels travel down with the activations to the last stage, which computes
// the loss. Schedules: GPipe, 1F1B-flush and ZB-H1 (whose backward is split
// into B, the input gradient, and W, the weight gradient), which drain the
// pipeline every step; and the cross-step 1F1B-async and 2BW, whose steady
// state runs on across steps: a step's stream may run backwards (and
// updates) of the previous step's micro-batches, which stay in flight
// between RunSteps. They warm up in the first step of a Train run and cool
// down in its last one. And interleaved 1F1B: the stage holds v model chunks
// (virtual stages c * K + stage, StageConfig::chunks), messages name the
// receiver's chunk, and activations wrap from the last worker to worker 0
// (whose upstream is then the last worker), gradients the other way.
// Every executed instruction is recorded in a bounded pipeline trace (see
// StageTrace).
//
// Thread-safety: public methods are thread-safe. The training thread owns
// the model and backend while a step runs; Weights() waits for the step in
// progress to end.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_EXECUTOR_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_EXECUTOR_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pipetrain/v1/stage.pb.h"
#include "spec/schedule.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "worker/nn/loss.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"
#include "worker/pipeline/mailbox.h"
#include "worker/pipeline/stage_metrics.h"
#include "worker/pipeline/stage_trace.h"
#include "worker/pipeline/weight_stash.h"

namespace pipetrain {

// Timings and memory of one stage, measured over its last step.
struct StageTimings {
  double forward_seconds = 0.0;   // per micro-batch (includes recompute)
  double backward_seconds = 0.0;  // per micro-batch
  double idle_seconds = 0.0;      // waiting for neighbours, whole step
  double optimizer_seconds = 0.0;
  double step_seconds = 0.0;
  int64_t peak_activation_bytes = 0;
  int peak_stash_depth = 0;  // weight versions stashed (async schedule)
};

class StageExecutor {
 public:
  // Validates the config and builds the stage: model layers, optimizer, and
  // (stage 0) the dataset. InvalidArgument naming the field for bad configs.
  // `backend` and `metrics` (may be null) are borrowed and must outlive the
  // executor.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const v1::StageConfig& config, Backend* backend,
      StageMetrics* metrics = nullptr);
  ~StageExecutor();

  const v1::StageConfig& config() const { return config_; }
  bool is_first() const { return config_.stage() == 0; }
  bool is_last() const { return config_.stage() == config_.num_stages() - 1; }
  // Model chunks (virtual stages) on this stage: v when interleaved, else 1.
  int num_chunks() const { return static_cast<int>(models_.size()); }
  // Whether training needs a downstream link: every stage but the last, and
  // with interleaving the last too (its wrap-around link to worker 0).
  bool needs_downstream() const { return !is_last() || num_chunks() > 1; }
  Mailbox* mailbox() { return &mailbox_; }

  // Links to the neighbours. The first stage has no upstream, the last no
  // downstream, except when interleaved: then the last stage's downstream
  // and the first's upstream are the wrap-around link between them (a
  // single stage links to itself). A link may be replaced at any time (a
  // neighbour reconnects).
  void SetDownstream(std::shared_ptr<StageLink> link);
  void SetUpstream(std::shared_ptr<StageLink> link);
  // Drops the upstream link if it is still `link`.
  void ClearUpstream(const StageLink* link);

  // Checks a message from a neighbour before it is delivered: kind, step,
  // micro-batch, tensor count, shapes and dtypes. InvalidArgument says what
  // is wrong.
  absl::Status ValidateIncoming(const StageMessage& message) const;

  // Trains steps next_step() .. until_step - 1 on the training thread and
  // returns at once with the target in force. While a run is in progress it
  // moves the target (never below the step in progress + 1). Fails with
  // FailedPrecondition after a failure. Cross-step schedules: stage 0 leads.
  // It decides when a step starts whether the step ends the run (cool-down)
  // and never lowers the target below a step it committed to continue into;
  // the later stages follow the decision, which travels with the step's
  // activations, whatever target they were given. So lowering stage 0's
  // target pauses the whole pipeline at the step it reports.
  absl::StatusOr<int64_t> Train(int64_t until_step);
  // Stops training (the step in progress fails with Cancelled) and waits.
  void Stop();
  // Waits until the current run ends; returns its final status.
  absl::Status Wait();

  v1::GetStatusResponse GetStatus(int64_t results_since) const;
  // The pipeline trace: one event per instruction run in steps >=
  // since_step, in execution order, from a window of the most recent steps
  // (StageTrace's bounds). Cheap enough to call from a gRPC reaction.
  v1::GetTraceResponse Trace(int64_t since_step) const {
    return trace_.Since(since_step);
  }
  absl::StatusOr<v1::GetWeightsResponse> Weights();
  int64_t next_step() const { return next_step_.load(); }
  StageTimings timings() const;
  int64_t num_parameters() const {
    int64_t n = 0;
    for (const auto& model : models_) n += model->num_parameters();
    return n;
  }
  // Of the first chunk's input and the last chunk's output.
  const Shape& input_shape() const { return models_.front()->input_shape(); }
  const Shape& output_shape() const { return models_.back()->output_shape(); }
  // Stage 0 only (0 elsewhere).
  int64_t steps_per_epoch() const {
    return order_ == nullptr ? 0 : order_->steps_per_epoch();
  }

 private:
  struct MicroBatch;
  struct StepState;
  // What a stage measured over one step's stream.
  struct StepCounters {
    double forward_seconds = 0.0;
    double backward_seconds = 0.0;
    double idle_seconds = 0.0;
    double optimizer_seconds = 0.0;
    int64_t held_bytes = 0;  // carried across steps (cross-step schedules)
    int64_t peak_bytes = 0;
    void Hold(int64_t bytes) {
      held_bytes += bytes;
      peak_bytes = std::max(peak_bytes, held_bytes);
    }
  };

  StageExecutor(const v1::StageConfig& config, Backend* backend,
                StageMetrics* metrics);
  // Adds `seconds` to a phase's compute counter.
  void CountCompute(StageMetrics::Phase phase, double seconds) const;
  void Loop();
  absl::Status RunStep(int64_t step);
  // Runs stream[begin..] of the step `current`.
  absl::Status RunInstructions(const std::vector<Instruction>& stream,
                               size_t begin, StepState* current);
  // Cross-step schedules: the steady part of `current`'s stream, then the
  // cool-down when the step turns out to be the run's last.
  absl::Status RunCrossStep(StepState* current);
  // Stage 0: decides (under mu_) whether `step` ends the run; a step that
  // does not commits the target to at least step + 2.
  bool CommitStep(int64_t step);
  // Later stages: adopt stage 0's decision for `step` as the target.
  void FollowUpstream(int64_t step, bool last);
  // The step state an instruction's micro-batch belongs to.
  absl::StatusOr<StepState*> Owner(const Instruction& instruction,
                                   StepState* current);
  absl::Status Execute(const Instruction& instruction, StepState* state);
  absl::Status LoadInput(int mb, StepState* state);
  // Stage 0: the mini-batch of `step`, read ahead on a helper thread while
  // the previous step computes.
  absl::StatusOr<Batch> TakeBatch(int64_t step);
  // The instructions on micro-batch mb of model chunk `chunk`.
  absl::Status ReceiveActivation(int mb, int chunk, StepState* state);
  absl::Status Forward(int mb, int chunk, StepState* state);
  absl::Status SendActivation(int mb, int chunk, StepState* state);
  absl::Status Loss(int mb, int chunk, StepState* state);
  absl::Status ReceiveGradient(int mb, int chunk, StepState* state);
  absl::Status Backward(int mb, int chunk, StepState* state);
  // Zero-bubble halves of Backward: B keeps in the micro-batch's contexts
  // only what W needs; W frees them.
  absl::Status BackwardInput(int mb, int chunk, StepState* state);
  absl::Status BackwardWeight(int mb, int chunk, StepState* state);
  // Re-materialization (when configured): recomputes micro-batch mb's
  // forward contexts from the stage input it kept.
  absl::Status Recompute(int mb, int chunk, const ForwardOptions& options,
                         StepState* state);
  // Micro-batch mb's forward options (dropout seed) in the current step.
  ForwardOptions MicroBatchOptions(int64_t step, int mb) const;
  absl::Status SendGradient(int mb, int chunk, StepState* state);
  absl::Status OptimizerStep(StepState* state);
  absl::StatusOr<double> GlobalSumSquares(double local, int64_t step);
  absl::StatusOr<StageMessage> Receive(MessageKind kind, int64_t step, int mb,
                                       int chunk);
  // The state of micro-batch mb in model chunk `chunk`.
  MicroBatch& Micro(StepState* state, int mb, int chunk);
  // Virtual stage 0 (loads the data) and the last one (computes the loss).
  bool IsFirstVirtual(int chunk) const { return is_first() && chunk == 0; }
  bool IsLastVirtual(int chunk) const {
    return is_last() && chunk == num_chunks() - 1;
  }
  // Creation: config.initial_weights, chunk after chunk.
  absl::Status LoadInitialWeights(const std::vector<Tensor>& weights);
  absl::Status SendTo(const std::shared_ptr<StageLink>& link,
                      StageMessage message);
  std::shared_ptr<StageLink> downstream() const;
  std::shared_ptr<StageLink> upstream() const;
  // Wire form of a device tensor: host, in the configured wire dtype.
  absl::StatusOr<Tensor> ToWire(const Tensor& device_tensor);
  absl::StatusOr<Tensor> FromWire(const Tensor& wire);

  // Constant after construction.
  const v1::StageConfig config_;
  Backend* const backend_;       // borrowed
  StageMetrics* const metrics_;  // borrowed, may be null
  int64_t rows_per_micro_batch_ = 0;
  Shape label_shape_;  // per sample, from the whole model's output
  ScheduleParams params_;
  std::vector<Instruction> schedule_;  // synchronous schedules
  bool cross_step_ = false;            // 1F1B-async, 2BW
  bool two_bw_ = false;
  // 1F1B-async: each micro-batch is its own update (loss scale 1 / rows).
  bool per_micro_batch_update_ = false;
  int lookback_ = 0;  // steps back a stream reaches (StepLookback)
  DatasetPair data_;  // stage 0 only
  std::unique_ptr<SampleOrder> order_;  // stage 0 only
  // Owned by the training thread.
  std::future<absl::StatusOr<Batch>> prefetch_;
  int64_t prefetch_step_ = -1;

  // Owned by the training thread while a step runs (compute_mu_ held).
  std::mutex compute_mu_;
  // One model per chunk, in chunk order; all_params_ is their parameters
  // in the same order (what the optimizer steps).
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<Param*> all_params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<SoftmaxCrossEntropyLoss> loss_;
  // Cross-step schedules only.
  std::unique_ptr<WeightStash> stash_;
  // Steps with micro-batches in flight: the running one and (cross-step)
  // earlier ones whose backwards have not all run.
  std::map<int64_t, std::unique_ptr<StepState>> in_flight_;
  StepCounters counters_;
  int64_t steps_in_run_ = 0;    // cross-step: steps since the last warm-up
  int64_t two_bw_version_ = 0;  // 2BW: the version the last step used

  Mailbox mailbox_;
  std::atomic<int64_t> next_step_{0};
  std::atomic<int64_t> until_step_{0};
  std::atomic<int64_t> weight_version_{0};
  std::atomic<bool> stop_{false};
  StageTrace trace_;  // thread-safe

  mutable std::mutex mu_;
  std::shared_ptr<StageLink> downstream_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<StageLink> upstream_ ABSL_GUARDED_BY(mu_);
  v1::StageState state_ ABSL_GUARDED_BY(mu_) = v1::STAGE_STATE_CONFIGURED;
  // Cross-step: the lowest target the run can still honour.
  int64_t committed_until_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepResult> results_ ABSL_GUARDED_BY(mu_);
  StageTimings timings_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

// Layers [begin, end) of a model: one chunk of a stage.
struct LayerSpan {
  int begin = 0;
  int end = 0;
};

// Sum of the bytes of every tensor a forward context keeps alive.
int64_t ContextBytes(const std::vector<LayerContext>& contexts);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_EXECUTOR_H_
