#include "worker/pipeline/stage_executor.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/elapsed.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/pipeline/stage_config.h"
#include "worker/pipeline/stage_evaluation.h"

namespace pipetrain {
namespace {

constexpr size_t kMaxResults = 10000;
using Clock = std::chrono::steady_clock;

}  // namespace

StageExecutor::StageExecutor(const v1::StageConfig& config,
                             StageMetrics* metrics)
    : metrics_(metrics),
      port_(config.recv_timeout_s(), metrics),
      trace_(config.stage()),
      snapshots_(config.spec().checkpoint_every(), config.start_step()),
      boundary_(config.restore_expected() ? -1 : config.start_step()),
      awaiting_restore_(config.restore_expected()) {}

StageExecutor::~StageExecutor() { Stop(); }

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const v1::StageConfig& config, Backend* backend, StageMetrics* metrics,
    const StageOptions& options) {
  ASSIGN_OR_RETURN(StageSetup setup, DecodeStageConfig(config));
  std::unique_ptr<StageExecutor> stage(new StageExecutor(config, metrics));
  const ScheduleParams params = setup.params;
  ASSIGN_OR_RETURN(stage->compute_,
                   StageCompute::Create(config, std::move(setup), backend,
                                        metrics, &stage->port_, options));
  std::vector<Shape> inputs;
  std::vector<Shape> outputs;
  for (const std::unique_ptr<Model>& model : stage->compute_->models()) {
    inputs.push_back(model->input_shape());
    outputs.push_back(model->output_shape());
  }
  stage->state_layout_ = StageStateLayout(*stage->compute_);
  stage->incoming_ = std::make_unique<IncomingCheck>(
      stage->compute_->setup(), stage->is_first(), stage->is_last(),
      std::move(inputs), std::move(outputs));
  stage->next_step_ = config.start_step();
  stage->until_step_ = config.start_step();
  stage->announced_until_ = config.start_step();
  if (metrics != nullptr) {
    metrics->stage_index()->Set(config.stage());
    metrics->theoretical_bubble()->Set(TheoreticalBubble(params, SimCosts()));
    metrics->weight_version()->Set(static_cast<double>(config.start_step()));
  }
  return stage;
}

int64_t StageExecutor::num_parameters() const {
  int64_t n = 0;
  for (const auto& model : compute_->models()) n += model->num_parameters();
  return n;
}

absl::Status StageExecutor::ValidateIncoming(const StageMessage& msg) const {
  // Cross-step: gradients of an earlier step's micro-batches arrive while
  // a later step runs.
  const int64_t next = next_step_.load();
  const StepWindow steps = {
      next - compute_->setup().lookback,
      std::max({until_step_.load(), next + 1,
                std::min(announced_until_.load(), next + 2)})};
  // The pass in progress, and the next one (an upstream stage may have
  // finished this one and begun the next).
  const int64_t passes = evaluation_passes_.load();
  const StepWindow evaluations = {passes - 1, passes + 1};
  RETURN_IF_ERROR(incoming_->Check(msg, steps, evaluations));
  // Stage 0 decided before the step's first forward that the run goes on
  // (CommitStep), so it may send the next step's activations before this
  // stage has run this one's, or been told to train at all; at most one
  // step past the one this stage is at (a warm-up is at most M forwards).
  if (msg.kind == MessageKind::kActivation &&
      msg.value != static_cast<int>(StepEnd::kEndRun)) {
    int64_t seen = announced_until_.load();
    while (seen < msg.step + 2 &&
           !announced_until_.compare_exchange_weak(seen, msg.step + 2)) {
    }
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::ValidateIncomingShape(
    const StageMessage& outline) const {
  const StepWindow any = {std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max()};
  return incoming_->Check(outline, any, any);
}

absl::StatusOr<int64_t> StageExecutor::Train(int64_t until_step) {
  absl::MutexLock lock(&mu_);
  if (state_ == v1::STAGE_STATE_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the stage failed: ", error_.ToString(), "; configure it again"));
  }
  if (awaiting_restore_) {
    return absl::FailedPreconditionError(
        "the stage waits for its state: RestoreState first (the config has "
        "restore_expected)");
  }
  if (needs_downstream() && !port_.has_downstream()) {
    return absl::FailedPreconditionError("no link to the downstream stage");
  }
  if (state_ == v1::STAGE_STATE_RUNNING) {
    // The loop reads the target before each step; the step in progress
    // always finishes.
    const int64_t target =
        std::max({until_step, next_step_.load() + 1, committed_until_});
    until_step_ = target;
    return target;
  }
  if (thread_.joinable()) thread_.join();
  if (until_step <= next_step_.load()) {
    state_ = v1::STAGE_STATE_DONE;
    return next_step_.load();
  }
  until_step_ = until_step;
  committed_until_ = 0;
  stop_ = false;
  state_ = v1::STAGE_STATE_RUNNING;
  thread_ = std::thread([this] { Loop(); });
  return until_step;
}

void StageExecutor::Stop() {
  stop_ = true;
  port_.mailbox()->Fail(absl::CancelledError("the stage was stopped"));
  std::thread t;
  {
    absl::MutexLock lock(&mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

absl::Status StageExecutor::Wait() {
  std::thread t;
  {
    absl::MutexLock lock(&mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
  absl::MutexLock lock(&mu_);
  return error_;
}

void StageExecutor::StartRun() {
  absl::MutexLock compute(&compute_mu_);
  in_flight_.clear();
  steps_in_run_ = 0;
  compute_->EndRun();
}

void StageExecutor::Loop() {
  StartRun();
  absl::Status status;
  while (true) {
    if (status.ok() && next_step_.load() >= until_step_.load()) {
      // The run may end at this boundary: a snapshot due here is taken
      // before DONE is published.
      status = SnapshotAtRest();
    }
    {
      // Deciding to end and publishing the end under one lock: a Train that
      // sees RUNNING has moved a target this loop will still read.
      absl::MutexLock lock(&mu_);
      if (!status.ok() || next_step_.load() >= until_step_.load()) {
        state_ = status.ok() ? v1::STAGE_STATE_DONE : v1::STAGE_STATE_FAILED;
        error_ = status;
        break;
      }
    }
    if (stop_.load()) {
      status = absl::CancelledError("the stage was stopped");
      continue;
    }
    const int64_t step = next_step_.load();
    status = RunStep(step);
    if (status.ok()) {
      ++next_step_;
      if (EvaluatesAfter(step)) {
        absl::MutexLock compute(&compute_mu_);
        status = RunEvaluation(/*max_samples=*/0).status();
      }
    }
    if (!status.ok()) {
      PT_LOG(WARNING) << "stage " << config().stage() << " of job "
                      << config().job_id() << " failed at step " << step << ": "
                      << status;
    }
  }
  // Snapshot requests that came while the run was ending (see Snapshot).
  if (status.ok()) status = SnapshotAtRest();
  if (!status.ok()) {
    PT_LOG(WARNING) << "stage " << config().stage() << " of job "
                    << config().job_id() << ": " << status;
  }
}

bool StageExecutor::EvaluatesAfter(int64_t step) const {
  const int64_t every = config().spec().eval_every();
  return every > 0 && (step + 1) % every == 0;
}

StepEnd StageExecutor::CommitStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (step + 1 >= until_step_.load()) return StepEnd::kEndRun;
  committed_until_ = std::max(committed_until_, step + 2);
  return EvaluatesAfter(step) ? StepEnd::kDrainForEvaluation
                              : StepEnd::kContinue;
}

void StageExecutor::FollowUpstream(int64_t step, StepEnd end) {
  absl::MutexLock lock(&mu_);
  if (end == StepEnd::kEndRun) {
    until_step_ = step + 1;
  } else {
    committed_until_ = std::max(committed_until_, step + 2);
    until_step_ = std::max(until_step_.load(), step + 2);
  }
}

absl::StatusOr<StepState*> StageExecutor::Owner(const Instruction& in,
                                                StepState* current) {
  if (in.step_offset == 0) return current;
  auto it = in_flight_.find(current->step + in.step_offset);
  if (it == in_flight_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no micro-batches of step ",
                     current->step + in.step_offset, " are in flight"));
  }
  return it->second.get();
}

absl::Status StageExecutor::RunInstructions(
    const std::vector<Instruction>& stream, size_t begin, StepState* current) {
  for (size_t i = begin; i < stream.size(); ++i) {
    const Instruction& instruction = stream[i];
    TraceRecord record;
    record.step = current->step;
    record.instruction = instruction;
    record.weight_version = compute_->weight_version();
    record.start_unix_us = StageTrace::NowUnixMicros();
    const int64_t run_before = compute_->WeightGradBytesRun();
    WeightUse use;
    absl::StatusOr<StepState*> owner = Owner(instruction, current);
    absl::Status status = owner.status();
    if (status.ok()) status = compute_->Execute(instruction, *owner, &use);
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat("step ", current->step, ", ", ToString(instruction),
                       ": ", status.message()));
    }
    record.end_unix_us = StageTrace::NowUnixMicros();
    record.weight_grad_bytes_run = compute_->WeightGradBytesRun() - run_before;
    if (use.recorded) {
      // What the operation itself ran with (stashed weights included).
      record.weight_version = use.version;
      record.weight_checksum = use.checksum;
    }
    trace_.Record(record);
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::RunCrossStep(StepState* current) {
  const StageSetup& setup = compute_->setup();
  ScheduleParams params = setup.params;
  params.steps_before = steps_in_run_;
  params.last_step = false;
  // Stage 0 decided before its first forward how the step ends (RunStep);
  // the others follow the decision its activations carry, known once their
  // last forward of the step has run.
  if (setup.two_bw) {
    // 2BW: a run segment's first two steps use its initial version; after
    // that each step uses the version its predecessor's predecessor
    // produced (one newer per step), i.e. W(t - 1) for step t.
    if (steps_in_run_ == 0) {
      two_bw_version_ = compute_->weight_version();
    } else if (steps_in_run_ >= 2) {
      ++two_bw_version_;
    }
    current->version = two_bw_version_;
  }
  ASSIGN_OR_RETURN(std::vector<Instruction> steady,
                   BuildSchedule(params, config().stage()));
  RETURN_IF_ERROR(RunInstructions(steady, 0, current));
  const StepEnd end = current->end;
  if (!is_first()) FollowUpstream(current->step, end);
  if (end == StepEnd::kContinue) {
    ++steps_in_run_;
    return absl::OkStatus();
  }
  // The cool-down: the run (or, before an evaluation, its segment) ends.
  params.last_step = true;
  ASSIGN_OR_RETURN(std::vector<Instruction> full,
                   BuildSchedule(params, config().stage()));
  RETURN_IF_ERROR(RunInstructions(full, steady.size(), current));
  steps_in_run_ = 0;
  compute_->EndRun();
  return absl::OkStatus();
}

absl::Status StageExecutor::RunStep(int64_t step) {
  absl::MutexLock compute(&compute_mu_);
  RETURN_IF_ERROR(SnapshotAt(step, /*entering=*/true));
  boundary_ = -1;  // the weights move during the step
  const auto start = Clock::now();
  const StageSetup& setup = compute_->setup();
  const int m = setup.params.micro_batches;
  if (!setup.cross_step || steps_in_run_ == 0) {
    // Cross-step schedules accumulate across the step boundary; their
    // updates start every accumulation afresh.
    compute_->ZeroGrads();
    if (metrics_ != nullptr) metrics_->in_flight()->Set(0);
  }
  compute_->StartStep();
  auto inserted = in_flight_.emplace(step, std::make_unique<StepState>());
  StepState& state = *inserted.first->second;
  state.step = step;
  state.micro.resize(static_cast<size_t>(m) * num_chunks());
  state.pending = m * num_chunks();
  state.read_ahead = step + 1 < until_step_.load();
  // Stage 0 commits, before the step's first forward, to run the next step
  // unless this one ends the run: a later stage may finish this step and
  // wait for the next one's activations before stage 0 finishes it, so a
  // pause must not land below that.
  if (is_first()) state.end = CommitStep(step);
  RETURN_IF_ERROR(setup.cross_step
                      ? RunCrossStep(&state)
                      : RunInstructions(setup.schedule, 0, &state));
  FinishStep(state, SecondsSince(start));
  // Drop the steps whose micro-batches have all finished.
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    it = it->second->pending <= 0 ? in_flight_.erase(it) : std::next(it);
  }
  boundary_ = step + 1;
  return absl::OkStatus();
}

absl::Status StageExecutor::SnapshotAt(int64_t step, bool entering) {
  return snapshots_.AtBoundary(step, entering, [this, step] {
    return CaptureStageState(*compute_, step);
  });
}

absl::Status StageExecutor::SnapshotAtRest() {
  absl::MutexLock compute(&compute_mu_);
  if (boundary_ < 0) return absl::OkStatus();
  return SnapshotAt(boundary_, /*entering=*/false);
}

absl::StatusOr<int64_t> StageExecutor::Snapshot(int64_t step) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ == v1::STAGE_STATE_FAILED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the stage failed: ", error_.ToString(), "; configure it again"));
    }
  }
  ASSIGN_OR_RETURN(const int64_t at, snapshots_.Request(step));
  {
    absl::MutexLock lock(&mu_);
    // A running stage takes it at that boundary, or at the end of its run
    // (the loop checks again after publishing that the run ended).
    if (state_ == v1::STAGE_STATE_RUNNING) return at;
  }
  RETURN_IF_ERROR(SnapshotAtRest());
  return at;
}

absl::Status StageExecutor::RestoreState(const TrainingState& state) {
  absl::MutexLock compute(&compute_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!config().restore_expected()) {
      return absl::FailedPreconditionError(
          "the stage was not configured to restore its state (set "
          "restore_expected in its config)");
    }
    if (state_ != v1::STAGE_STATE_CONFIGURED) {
      return absl::FailedPreconditionError(
          "the stage has trained: restore right after Configure");
    }
  }
  RETURN_IF_ERROR(RestoreStageState(state, compute_.get()));
  boundary_ = config().start_step();
  absl::MutexLock lock(&mu_);
  awaiting_restore_ = false;
  return absl::OkStatus();
}

void StageExecutor::FinishStep(const StepState& state, double seconds) {
  const StepCounters& counters = compute_->counters();
  const int64_t version = compute_->weight_version();
  v1::StepResult result;
  result.set_step(state.step);
  result.set_seconds(seconds);
  result.set_weight_version(version);
  if (is_first()) {
    result.set_epoch(compute_->data()->order().EpochOfStep(state.step));
  }
  if (is_last()) {
    // The last stage runs every backward of a step in its own stream
    // (its 1F1B warm-up is 0), so the step's loss is complete here.
    result.set_loss(state.loss.mean_loss());
    result.set_accuracy(state.loss.accuracy());
  }
  if (metrics_ != nullptr) {
    metrics_->steps()->Increment();
    metrics_->samples()->Increment(
        static_cast<double>(config().spec().batch_size()));
    metrics_->weight_version()->Set(static_cast<double>(version));
    metrics_->peak_activation_bytes()->Set(
        static_cast<double>(counters.peak_bytes));
    if (is_last()) metrics_->loss()->Set(state.loss.mean_loss());
  }
  const int m = compute_->setup().params.micro_batches;
  absl::MutexLock lock(&mu_);
  results_.push_back(result);
  if (results_.size() > kMaxResults) results_.pop_front();
  timings_.forward_seconds = counters.forward_seconds / m;
  timings_.backward_seconds = counters.backward_seconds / m;
  timings_.idle_seconds = counters.idle_seconds;
  timings_.optimizer_seconds = counters.optimizer_seconds;
  timings_.step_seconds = seconds;
  timings_.peak_activation_bytes = counters.peak_bytes;
  timings_.peak_stash_depth = compute_->stash_peak_depth();
}

absl::StatusOr<v1::EvalResult> StageExecutor::Evaluate(int64_t max_samples) {
  if (max_samples < 0) {
    return absl::InvalidArgumentError("max_samples: must be >= 0");
  }
  {
    // Refuse at once rather than wait for a step that may wait on a
    // neighbour for a whole receive timeout.
    absl::MutexLock lock(&mu_);
    if (state_ == v1::STAGE_STATE_RUNNING) {
      return absl::FailedPreconditionError(
          "the stage is training: evaluate after the run ends (pause first)");
    }
  }
  absl::MutexLock compute(&compute_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ == v1::STAGE_STATE_RUNNING) {
      return absl::FailedPreconditionError(
          "the stage is training: evaluate after the run ends (pause first)");
    }
    if (state_ == v1::STAGE_STATE_FAILED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the stage failed: ", error_.ToString(), "; configure it again"));
    }
    if (awaiting_restore_) {
      return absl::FailedPreconditionError(
          "the stage waits for its state: RestoreState first");
    }
  }
  return RunEvaluation(max_samples);
}

absl::StatusOr<v1::EvalResult> StageExecutor::RunEvaluation(
    int64_t max_samples) {
  const int64_t pass = evaluation_passes_.fetch_add(1);
  ASSIGN_OR_RETURN(EvalStats stats,
                   RunEvaluationPass(compute_.get(), pass, max_samples));
  v1::EvalResult result;
  if (!is_last()) return result;
  result.set_step(next_step_.load());
  result.set_loss(stats.loss.mean_loss());
  result.set_accuracy(stats.loss.accuracy());
  result.set_samples(stats.samples);
  absl::MutexLock lock(&mu_);
  evaluations_.push_back(result);
  if (evaluations_.size() > kMaxResults) evaluations_.pop_front();
  return result;
}

v1::GetStatusResponse StageExecutor::GetStatus(int64_t results_since) const {
  v1::GetStatusResponse out;
  absl::MutexLock lock(&mu_);
  out.set_state(state_);
  out.set_next_step(next_step_.load());
  out.set_weight_version(compute_->weight_version());
  if (!error_.ok()) {
    out.set_error(error_.ToString());
    out.set_error_code(static_cast<int>(error_.code()));
  }
  for (const v1::StepResult& r : results_) {
    if (r.step() >= results_since) *out.add_results() = r;
  }
  for (const v1::EvalResult& e : evaluations_) {
    if (e.step() >= results_since) *out.add_evaluations() = e;
  }
  out.set_forward_seconds(timings_.forward_seconds);
  out.set_backward_seconds(timings_.backward_seconds);
  out.set_idle_fraction(timings_.step_seconds > 0
                            ? timings_.idle_seconds / timings_.step_seconds
                            : 0.0);
  out.set_peak_activation_bytes(timings_.peak_activation_bytes);
  out.set_optimizer_seconds(timings_.optimizer_seconds);
  out.set_stash_depth(timings_.peak_stash_depth);
  out.set_step_seconds(timings_.step_seconds);
  return out;
}

StageTimings StageExecutor::timings() const {
  absl::MutexLock lock(&mu_);
  return timings_;
}

absl::StatusOr<v1::GetWeightsResponse> StageExecutor::Weights() {
  absl::MutexLock compute(&compute_mu_);
  v1::GetWeightsResponse out;
  out.set_weight_version(compute_->weight_version());
  for (const std::unique_ptr<Model>& model : compute_->models()) {
    ASSIGN_OR_RETURN(std::vector<Tensor> host, model->ParamsToHost());
    for (size_t i = 0; i < host.size(); ++i) {
      v1::TensorProto* t = out.add_weights();
      t->set_name(model->params()[i]->name);
      t->set_dtype(v1::DTYPE_F32);
      for (int64_t d : host[i].shape()) t->add_shape(d);
      t->set_data(host[i].raw(), host[i].bytes());
    }
  }
  return out;
}

}  // namespace pipetrain
