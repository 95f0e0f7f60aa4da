// StageExecutor: one stage of a pipeline, transport-free.
//
// Configured with a StageConfig (layers [begin, end) of a job's model, its
// place in the pipeline, the schedule), it runs the schedule's instruction
// stream once per step on its own thread: the instructions themselves are
// StageCompute's (stage_compute.h), the links and mailbox its StagePort's
// (stage_port.h); this class is the interpreter around them: the run loop,
// the targets, the cross-step commit protocol, evaluation points, status.
//
// Schedules: GPipe, 1F1B-flush and ZB-H1 (whose backward is split into B,
// the input gradient, and W, the weight gradient), which drain the
// pipeline every step; and the cross-step 1F1B-async and 2BW, whose steady
// state runs on across steps: a step's stream may run backwards (and
// updates) of the previous step's micro-batches, which stay in flight
// between RunSteps. They warm up in the first step of a run segment and
// cool down in its last one. And interleaved 1F1B: the stage holds v model
// chunks (virtual stages c * K + stage, StageConfig::chunks), messages name
// the receiver's chunk, and activations wrap from the last worker to worker
// 0 (whose upstream is then the last worker), gradients the other way.
// Every executed instruction is recorded in a bounded pipeline trace (see
// StageTrace).
//
// Evaluation: a forward-only pass of the held-out split through the job's
// stages (stage_evaluation.h), on request (Evaluate) or every
// TrainingSpec.eval_every steps while training. Under the cross-step
// schedules an evaluation point ends a run segment: stage 0 decides that
// the step drains (StepEnd::kDrainForEvaluation, carried down with the
// step's activations), every stage cools down at that step, evaluates, and
// warms up again for the next one, exactly as if the run had paused and
// resumed there (so 2BW's first two steps after it share a version).
//
// Checkpoints: the stage snapshots its state at step boundaries (every
// TrainingSpec.checkpoint_every steps, and on request) into host memory on
// the training thread, and streams it out later (stage_snapshot.h). A stage
// configured with restore_expected loads its state (RestoreState) before it
// may train.
//
// Thread-safety: public methods are thread-safe. The training thread owns
// the compute state while a step or an evaluation runs (compute_mu_);
// Weights() and Evaluate() wait for the step in progress to end.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_EXECUTOR_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_EXECUTOR_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/stage.pb.h"
#include "spec/schedule.h"
#include "worker/compute/backend.h"
#include "worker/pipeline/incoming_check.h"
#include "worker/pipeline/mailbox.h"
#include "worker/pipeline/stage_compute.h"
#include "worker/pipeline/stage_metrics.h"
#include "worker/pipeline/stage_port.h"
#include "worker/pipeline/stage_snapshot.h"
#include "worker/pipeline/stage_state.h"
#include "worker/pipeline/stage_trace.h"

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
  // its part of the dataset (stage 0 the inputs, the last stage the labels).
  // InvalidArgument naming the field for bad configs. `backend` and `metrics`
  // (may be null) are borrowed and must outlive the executor.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const v1::StageConfig& config, Backend* backend,
      StageMetrics* metrics = nullptr, const StageOptions& options = {});
  ~StageExecutor();

  const v1::StageConfig& config() const { return compute_->config(); }
  bool is_first() const { return compute_->is_first(); }
  bool is_last() const { return compute_->is_last(); }
  // Model chunks (virtual stages) on this stage: v when interleaved, else 1.
  int num_chunks() const { return compute_->num_chunks(); }
  // Whether training needs a downstream link: every stage but the last, and
  // with interleaving the last too (its wrap-around link to worker 0).
  bool needs_downstream() const { return !is_last() || num_chunks() > 1; }
  Mailbox* mailbox() { return port_.mailbox(); }

  // Links to the neighbours (see StagePort).
  void SetDownstream(std::shared_ptr<StageLink> link) {
    port_.SetDownstream(std::move(link));
  }
  void SetUpstream(std::shared_ptr<StageLink> link) {
    port_.SetUpstream(std::move(link));
  }
  // Sets the upstream link unless the stage has a live one (then false):
  // for streams, which must never displace the link a job runs on.
  bool SetUpstreamIfNone(std::shared_ptr<StageLink> link) {
    return port_.SetUpstreamIfNone(std::move(link));
  }
  // Drops the upstream link if it is still `link`.
  void ClearUpstream(const StageLink* link) { port_.ClearUpstream(link); }

  // Checks a message from a neighbour before it is delivered: kind, step
  // (or evaluation pass), micro-batch, chunk, tensor count, shapes and
  // dtypes (float32). InvalidArgument says what is wrong. The steps taken
  // run from the oldest a stream may still reach back to (lookback) to the
  // last the stage has been told to train, or that the upstream stage has
  // committed to: an accepted activation of step t that does not end the
  // run admits step t + 1, even before this stage has been told to train
  // it (a deep cross-step warm-up runs stage 0 a whole step ahead), but
  // never more than one step past next_step().
  absl::Status ValidateIncoming(const StageMessage& message) const;
  // The same checks but the step window, for a message whose frames are
  // still to come (the window moves while they arrive); `outline`'s
  // tensors need no storage. Run before the message is allocated.
  absl::Status ValidateIncomingShape(const StageMessage& outline) const;

  // Trains steps next_step() .. until_step - 1 on the training thread and
  // returns at once with the target in force. While a run is in progress it
  // moves the target (never below the step in progress + 1). Fails with
  // FailedPrecondition after a failure. Stage 0 leads: it decides when a
  // step starts whether the step ends the run and otherwise commits to the
  // next one, and never lowers the target below a step it committed to (a
  // later stage may already wait for that step's activations). Under the
  // cross-step schedules the later stages also follow the decision, which
  // travels with the step's activations (cool-down), whatever target they
  // were given. So lowering stage 0's target first and giving the others
  // the target it reports pauses the whole pipeline at one step.
  absl::StatusOr<int64_t> Train(int64_t until_step);
  // Stops training (the step in progress fails with Cancelled) and waits.
  void Stop();
  // Waits until the current run ends; returns its final status.
  absl::Status Wait();

  // Runs this stage's part of an evaluation pass at the current weights
  // (the first max_samples samples of the held-out split, all when 0) and
  // returns when it is done: every stage of the job must be called. The
  // last stage returns the loss and accuracy (and records them in
  // GetStatus().evaluations, with step = next_step()); the others return an
  // empty result. FailedPrecondition while training or after a failure.
  absl::StatusOr<v1::EvalResult> Evaluate(int64_t max_samples);

  // Asks for a snapshot of the state at the boundary before `step` and
  // returns `step`. A training stage takes it when it gets there (or ends
  // its run there); an idle one at that boundary takes it now. Errors as
  // StageSnapshots::Request (FailedPrecondition once past `step`), and
  // FailedPrecondition after a failure.
  absl::StatusOr<int64_t> Snapshot(int64_t step);
  // The snapshot of the boundary before `step`; NotFound when none is held.
  absl::StatusOr<std::shared_ptr<const StageStateSnapshot>> FetchSnapshot(
      int64_t step) const {
    return snapshots_.Find(step);
  }
  // Loads the stage's parameters and optimizer state (RestoreStageState)
  // into a stage configured with restore_expected that has not trained;
  // until it succeeds Train and Evaluate answer FailedPrecondition. Waits
  // for an evaluation in progress.
  absl::Status RestoreState(const TrainingState& state);
  // The tensors the stage's state consists of (names, checkpoint shapes).
  const StateLayout& state_layout() const { return state_layout_; }

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
  int64_t num_parameters() const;
  // Of the first chunk's input and the last chunk's output.
  const Shape& input_shape() const {
    return compute_->models().front()->input_shape();
  }
  const Shape& output_shape() const {
    return compute_->models().back()->output_shape();
  }
  // Stage 0 only (0 elsewhere).
  int64_t steps_per_epoch() const {
    return is_first() ? compute_->data()->order().steps_per_epoch() : 0;
  }

 private:
  StageExecutor(const v1::StageConfig& config, StageMetrics* metrics);
  void Loop() ABSL_LOCKS_EXCLUDED(compute_mu_, mu_);
  // Starts a run: nothing is in flight (the last run drained or failed).
  void StartRun() ABSL_LOCKS_EXCLUDED(compute_mu_, mu_);
  absl::Status RunStep(int64_t step) ABSL_LOCKS_EXCLUDED(compute_mu_, mu_);
  // Runs stream[begin..] of the step `current`.
  absl::Status RunInstructions(const std::vector<Instruction>& stream,
                               size_t begin, StepState* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  // Cross-step schedules: the steady part of `current`'s stream, then the
  // cool-down when the step turns out to end a run segment.
  absl::Status RunCrossStep(StepState* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  // Stage 0, every schedule: decides (under mu_) how `step` ends; a step
  // that does not end the run commits the target to at least step + 2.
  StepEnd CommitStep(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Later stages: adopt stage 0's decision for `step` as the target.
  void FollowUpstream(int64_t step, StepEnd end) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an evaluation pass follows step `step` (TrainingSpec.eval_every).
  bool EvaluatesAfter(int64_t step) const;
  // The step state an instruction's micro-batch belongs to.
  absl::StatusOr<StepState*> Owner(const Instruction& instruction,
                                   StepState* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  // Publishes a finished step's result, timings and metrics.
  void FinishStep(const StepState& state, double seconds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  // Snapshots the boundary before `step` when it is wanted (StageSnapshots).
  absl::Status SnapshotAt(int64_t step, bool entering)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  // Between runs: snapshots the boundary the weights are at, if wanted.
  absl::Status SnapshotAtRest() ABSL_LOCKS_EXCLUDED(compute_mu_);
  // Runs one evaluation pass (compute_mu_ held) and records its result.
  absl::StatusOr<v1::EvalResult> RunEvaluation(int64_t max_samples)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);

  // Constant after construction.
  StageMetrics* const metrics_;  // borrowed, may be null
  StagePort port_;               // thread-safe
  std::unique_ptr<StageCompute> compute_;
  std::unique_ptr<const IncomingCheck> incoming_;
  StageTrace trace_;          // thread-safe
  StageSnapshots snapshots_;  // thread-safe
  StateLayout state_layout_;

  // Owned by the thread holding compute_mu_ (the training thread while a
  // run lasts): compute_ and the following.
  absl::Mutex compute_mu_;
  // Steps with micro-batches in flight: the running one and (cross-step)
  // earlier ones whose backwards have not all run.
  std::map<int64_t, std::unique_ptr<StepState>> in_flight_
      ABSL_GUARDED_BY(compute_mu_);
  // Cross-step: steps since the last warm-up.
  int64_t steps_in_run_ ABSL_GUARDED_BY(compute_mu_) = 0;
  // 2BW: the version the last step used.
  int64_t two_bw_version_ ABSL_GUARDED_BY(compute_mu_) = 0;
  // The step whose boundary the weights are at (the next to run); -1 while
  // a step runs, after a failed one, and before an expected restore.
  int64_t boundary_ ABSL_GUARDED_BY(compute_mu_);

  std::atomic<int64_t> next_step_{0};
  std::atomic<int64_t> until_step_{0};
  // One past the last step the upstream stage has committed to, by the
  // activations ValidateIncoming accepted (start_step until one arrives).
  mutable std::atomic<int64_t> announced_until_{0};
  // Evaluation passes this stage has started (numbers the next one's
  // messages; equal on every stage of a job between passes).
  std::atomic<int64_t> evaluation_passes_{0};
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  v1::StageState state_ ABSL_GUARDED_BY(mu_) = v1::STAGE_STATE_CONFIGURED;
  // Stage 0: the lowest target the run can still honour.
  int64_t committed_until_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // Configured with restore_expected and not restored yet.
  bool awaiting_restore_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepResult> results_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::EvalResult> evaluations_ ABSL_GUARDED_BY(mu_);
  StageTimings timings_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_EXECUTOR_H_
