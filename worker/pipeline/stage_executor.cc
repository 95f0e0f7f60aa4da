#include "worker/pipeline/stage_executor.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

constexpr size_t kMaxResults = 10000;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

DType FromProto(v1::DType d) {
  switch (d) {
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_F16:
      return DType::kF16;
    default:
      return DType::kF32;
  }
}

absl::StatusOr<ScheduleKind> FromProto(v1::ScheduleKindProto kind) {
  switch (kind) {
    case v1::SCHEDULE_GPIPE:
      return ScheduleKind::kGPipe;
    case v1::SCHEDULE_1F1B_FLUSH:
      return ScheduleKind::kOneFOneBFlush;
    case v1::SCHEDULE_ZB_H1:
      return ScheduleKind::kZeroBubbleH1;
    case v1::SCHEDULE_ASYNC_1F1B:
      return ScheduleKind::kOneFOneBAsync;
    case v1::SCHEDULE_2BW:
      return ScheduleKind::kTwoBW;
    case v1::SCHEDULE_INTERLEAVED:
      return ScheduleKind::kInterleaved;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: unknown ", static_cast<int>(kind)));
  }
}

int64_t TensorsBytes(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.empty() ? 0 : t.bytes();
  return n;
}

absl::Status CheckTensor(const Tensor& t, const Shape& want, DType dtype,
                         const char* what) {
  if (t.shape() != want || t.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected ", DTypeName(dtype), ShapeToString(want),
                     ", got ", DTypeName(t.dtype()), ShapeToString(t.shape())));
  }
  return absl::OkStatus();
}

// The layer ranges of a worker's model chunks: config.chunks for the
// interleaved schedule, else the one [layer_begin, layer_end).
absl::StatusOr<std::vector<LayerSpan>> ChunkSpans(
    const v1::StageConfig& config) {
  if (config.schedule() != v1::SCHEDULE_INTERLEAVED) {
    if (config.chunks_size() > 0 || config.virtual_stages() > 1) {
      return absl::InvalidArgumentError(
          "config.chunks / config.virtual_stages: only for "
          "SCHEDULE_INTERLEAVED");
    }
    return std::vector<LayerSpan>{{config.layer_begin(), config.layer_end()}};
  }
  if (config.virtual_stages() < 2 ||
      config.chunks_size() != config.virtual_stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.chunks: interleaved needs virtual_stages >= 2 chunks, got ",
        config.chunks_size(), " chunks and virtual_stages ",
        config.virtual_stages()));
  }
  std::vector<LayerSpan> spans;
  for (const v1::LayerRange& range : config.chunks()) {
    if (range.begin() >= range.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.chunks[", spans.size(), "]: [", range.begin(),
                       ", ", range.end(), ") is empty"));
    }
    spans.push_back({range.begin(), range.end()});
  }
  return spans;
}

}  // namespace

int64_t ContextBytes(const std::vector<LayerContext>& contexts) {
  int64_t n = 0;
  for (const LayerContext& c : contexts) {
    n += TensorsBytes(c.saved) + ContextBytes(c.children);
  }
  return n;
}

// What a stage holds for one micro-batch during a step.
struct StageExecutor::MicroBatch {
  Tensor input;   // device: the stage's input (kept for backward / remat)
  Tensor output;  // device: the stage's output until sent or lossed
  Tensor labels;  // host, float32
  std::vector<LayerContext> contexts;
  Tensor grad_output;  // device: dL/d(output)
  Tensor grad_input;   // device: dL/d(input), until sent
  // The weight version its forward used (and its backward must use).
  int64_t version = 0;
};

// What a stage holds for one step's micro-batches, from the step's first
// instruction until its last backward (which, in the cross-step schedules,
// may run in the next step's stream).
struct StageExecutor::StepState {
  int64_t step = 0;
  std::vector<MicroBatch> micro;
  int pending = 0;  // micro-batches whose backward has not finished
  Tensor inputs;    // stage 0: the step's whole mini-batch (host)
  Tensor labels;
  LossStats loss;
  // 2BW: the weight version every micro-batch of the step uses.
  int64_t version = 0;
  // Cross-step: stage 0 decided that this step ends the run (drains); the
  // step's activations carry the decision down (StageMessage::value = 1).
  bool last_of_run = false;
};

StageExecutor::StageExecutor(const v1::StageConfig& config, Backend* backend,
                             StageMetrics* metrics)
    : config_(config),
      backend_(backend),
      metrics_(metrics),
      trace_(config.stage()) {}

void StageExecutor::CountCompute(StageMetrics::Phase phase,
                                 double seconds) const {
  if (metrics_ != nullptr) metrics_->compute_seconds(phase)->Increment(seconds);
}

StageExecutor::~StageExecutor() { Stop(); }

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const v1::StageConfig& config, Backend* backend, StageMetrics* metrics) {
  const v1::TrainingSpec& spec = config.spec();
  RETURN_IF_ERROR(ValidateTrainingSpec(spec));
  if (config.job_id().empty()) {
    return absl::InvalidArgumentError("config.job_id: missing");
  }
  if (config.num_stages() < 1 || config.stage() < 0 ||
      config.stage() >= config.num_stages()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.stage: ", config.stage(), " is not in [0, ",
                     config.num_stages(), ")"));
  }
  const bool last = config.stage() == config.num_stages() - 1;
  const bool interleaved = config.schedule() == v1::SCHEDULE_INTERLEAVED;
  if (!last && config.downstream().empty()) {
    return absl::InvalidArgumentError(
        "config.downstream: every stage but the last needs its neighbour");
  }
  if (interleaved && config.downstream().empty()) {
    return absl::InvalidArgumentError(
        "config.downstream: interleaved: the last worker needs worker 0 (the "
        "wrap-around link)");
  }
  if (config.start_step() < 0) {
    return absl::InvalidArgumentError("config.start_step: must be >= 0");
  }
  ASSIGN_OR_RETURN(std::vector<Shape> shapes, ValidateModelSpec(spec.model()));

  std::unique_ptr<StageExecutor> stage(
      new StageExecutor(config, backend, metrics));
  const int64_t m = std::max<int64_t>(1, spec.micro_batches());
  stage->rows_per_micro_batch_ = spec.batch_size() / m;
  stage->label_shape_ = shapes.back();
  stage->label_shape_.pop_back();
  ScheduleParams& params = stage->params_;
  ASSIGN_OR_RETURN(params.kind, FromProto(config.schedule()));
  params.num_stages = config.num_stages();
  params.micro_batches = static_cast<int>(m);
  ASSIGN_OR_RETURN(std::vector<LayerSpan> spans, ChunkSpans(config));
  params.virtual_stages = static_cast<int>(spans.size());
  // Cross-step streams are built per step; this validates the parameters.
  ASSIGN_OR_RETURN(stage->schedule_, BuildSchedule(params, config.stage()));
  stage->cross_step_ = IsCrossStep(params.kind);
  stage->two_bw_ = params.kind == ScheduleKind::kTwoBW;
  stage->per_micro_batch_update_ = params.kind == ScheduleKind::kOneFOneBAsync;
  stage->lookback_ = StepLookback(params, config.stage());
  for (const LayerSpan& span : spans) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<Model> model,
        Model::Build(spec.model(), span.begin, span.end, backend, spec.seed()));
    stage->all_params_.insert(stage->all_params_.end(), model->params().begin(),
                              model->params().end());
    stage->models_.push_back(std::move(model));
  }
  if (config.initial_weights_size() > 0) {
    std::vector<Tensor> weights;
    for (const v1::TensorProto& t : config.initial_weights()) {
      if (t.dtype() != v1::DTYPE_F32 ||
          t.data().size() != NumElements({t.shape().begin(), t.shape().end()}) *
                                 sizeof(float)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config.initial_weights: ", t.name(),
            " must be float32 with as many bytes as its shape needs"));
      }
      Tensor host = Tensor::Host({t.shape().begin(), t.shape().end()});
      std::copy(t.data().begin(), t.data().end(),
                static_cast<char*>(host.raw()));
      weights.push_back(host);
    }
    RETURN_IF_ERROR(stage->LoadInitialWeights(weights));
  }
  ASSIGN_OR_RETURN(stage->optimizer_,
                   Optimizer::Create(spec.optimizer(), backend));
  const bool async = params.kind == ScheduleKind::kOneFOneBAsync;
  if (stage->cross_step_ && spec.optimizer().clip_grad_norm() > 0) {
    // A global norm would make every update wait for every stage.
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.clip_grad_norm: not supported with ",
                     v1::ScheduleKindProto_Name(config.schedule())));
  }
  if (config.vertical_sync() && !async) {
    return absl::InvalidArgumentError(
        "config.vertical_sync: only applies to SCHEDULE_ASYNC_1F1B");
  }
  if (stage->cross_step_) {
    stage->stash_ = std::make_unique<WeightStash>(backend, stage->all_params_);
  }
  if (last) stage->loss_ = std::make_unique<SoftmaxCrossEntropyLoss>(backend);
  if (config.stage() == 0) {
    ASSIGN_OR_RETURN(stage->data_, OpenDataset(spec.data(), spec.seed()));
    stage->order_ = std::make_unique<SampleOrder>(
        stage->data_.train->size(), spec.batch_size(), spec.seed());
  }
  stage->next_step_ = config.start_step();
  stage->until_step_ = config.start_step();
  // Versions count optimizer steps: M per step under the async schedule.
  stage->weight_version_ =
      async ? config.start_step() * m : config.start_step();
  if (metrics != nullptr) {
    metrics->stage_index()->Set(config.stage());
    metrics->theoretical_bubble()->Set(TheoreticalBubble(params, SimCosts()));
    metrics->weight_version()->Set(static_cast<double>(config.start_step()));
  }
  return stage;
}

absl::Status StageExecutor::LoadInitialWeights(
    const std::vector<Tensor>& weights) {
  if (models_.size() == 1) return models_.front()->LoadParams(weights);
  if (weights.size() != all_params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.initial_weights: expected ", all_params_.size(),
                     " tensors, got ", weights.size()));
  }
  auto next = weights.begin();
  for (const std::unique_ptr<Model>& model : models_) {
    const auto end = next + static_cast<ptrdiff_t>(model->params().size());
    RETURN_IF_ERROR(model->LoadParams(std::vector<Tensor>(next, end)));
    next = end;
  }
  return absl::OkStatus();
}

StageExecutor::MicroBatch& StageExecutor::Micro(StepState* state, int mb,
                                                int chunk) {
  return state->micro[static_cast<size_t>(chunk) * params_.micro_batches + mb];
}

void StageExecutor::SetDownstream(std::shared_ptr<StageLink> link) {
  std::lock_guard<std::mutex> lock(mu_);
  downstream_ = std::move(link);
}

void StageExecutor::SetUpstream(std::shared_ptr<StageLink> link) {
  std::lock_guard<std::mutex> lock(mu_);
  upstream_ = std::move(link);
}

void StageExecutor::ClearUpstream(const StageLink* link) {
  std::lock_guard<std::mutex> lock(mu_);
  if (upstream_.get() == link) upstream_.reset();
}

std::shared_ptr<StageLink> StageExecutor::downstream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return downstream_;
}

std::shared_ptr<StageLink> StageExecutor::upstream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return upstream_;
}

absl::Status StageExecutor::ValidateIncoming(const StageMessage& msg) const {
  const int64_t m = std::max<int64_t>(1, config_.spec().micro_batches());
  // Cross-step: gradients of an earlier step's micro-batches arrive while
  // a later step runs.
  const int64_t next = next_step_.load();
  const int64_t low = next - lookback_;
  const int64_t until = std::max(until_step_.load(), next + 1);
  if (msg.step < low || msg.step >= until) {
    return absl::InvalidArgumentError(absl::StrCat("unknown step ", msg.step,
                                                   " (expecting steps [", low,
                                                   ", ", until, "))"));
  }
  if (msg.micro_batch < 0 || msg.micro_batch >= m) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown micro-batch ", msg.micro_batch, " (M = ", m, ")"));
  }
  if (msg.chunk < 0 || msg.chunk >= num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown chunk ", msg.chunk, " (", num_chunks(), " on this stage)"));
  }
  const Model& model = *models_[msg.chunk];
  const DType wire = FromProto(config_.wire_dtype());
  Shape rows = {rows_per_micro_batch_};
  switch (msg.kind) {
    case MessageKind::kActivation: {
      if (IsFirstVirtual(msg.chunk)) {
        return absl::InvalidArgumentError("stage 0 takes no activations");
      }
      if (msg.tensors.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an activation carries 2 tensors (activation, labels), got ",
            msg.tensors.size()));
      }
      Shape act = rows;
      act.insert(act.end(), model.input_shape().begin(),
                 model.input_shape().end());
      RETURN_IF_ERROR(CheckTensor(msg.tensors[0], act, wire, "activation"));
      Shape labels = rows;
      labels.insert(labels.end(), label_shape_.begin(), label_shape_.end());
      return CheckTensor(msg.tensors[1], labels, DType::kF32, "labels");
    }
    case MessageKind::kGradient: {
      if (IsLastVirtual(msg.chunk)) {
        return absl::InvalidArgumentError("the last stage takes no gradients");
      }
      if (msg.tensors.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a gradient carries 1 tensor, got ", msg.tensors.size()));
      }
      Shape grad = rows;
      grad.insert(grad.end(), model.output_shape().begin(),
                  model.output_shape().end());
      return CheckTensor(msg.tensors[0], grad, wire, "gradient");
    }
    case MessageKind::kNormPartial:
    case MessageKind::kNormTotal:
      if (!msg.tensors.empty()) {
        return absl::InvalidArgumentError("norm messages carry no tensors");
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown message kind");
}

absl::StatusOr<int64_t> StageExecutor::Train(int64_t until_step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == v1::STAGE_STATE_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the stage failed: ", error_.ToString(), "; configure it again"));
  }
  if (needs_downstream() && downstream_ == nullptr) {
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
  mailbox_.Fail(absl::CancelledError("the stage was stopped"));
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

absl::Status StageExecutor::Wait() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void StageExecutor::Loop() {
  {
    // A run starts with an empty pipeline (the last one drained or failed).
    std::lock_guard<std::mutex> compute(compute_mu_);
    in_flight_.clear();
    steps_in_run_ = 0;
    if (stash_ != nullptr) stash_->SetFloor(-1);
  }
  absl::Status status;
  while (true) {
    {
      // Deciding to end and publishing the end under one lock: a Train that
      // sees RUNNING has moved a target this loop will still read.
      std::lock_guard<std::mutex> lock(mu_);
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
    status = RunStep(next_step_.load());
    if (status.ok()) {
      ++next_step_;
    } else {
      PT_LOG(WARNING) << "stage " << config_.stage() << " of job "
                      << config_.job_id() << " failed at step "
                      << next_step_.load() << ": " << status;
    }
  }
}

bool StageExecutor::CommitStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool last = step + 1 >= until_step_.load();
  if (!last) committed_until_ = std::max(committed_until_, step + 2);
  return last;
}

void StageExecutor::FollowUpstream(int64_t step, bool last) {
  std::lock_guard<std::mutex> lock(mu_);
  if (last) {
    until_step_ = step + 1;
  } else {
    committed_until_ = std::max(committed_until_, step + 2);
    until_step_ = std::max(until_step_.load(), step + 2);
  }
}

absl::StatusOr<StageExecutor::StepState*> StageExecutor::Owner(
    const Instruction& in, StepState* current) {
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
    record.weight_version = weight_version_.load();
    record.start_unix_us = StageTrace::NowUnixMicros();
    absl::StatusOr<StepState*> owner = Owner(instruction, current);
    absl::Status status = owner.status();
    if (status.ok()) status = Execute(instruction, *owner);
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat("step ", current->step, ", ", ToString(instruction),
                       ": ", status.message()));
    }
    record.end_unix_us = StageTrace::NowUnixMicros();
    if (instruction.op == OpKind::kForward ||
        instruction.op == OpKind::kBackward ||
        instruction.op == OpKind::kBackwardInput) {
      // The version the micro-batch's weights had (stashed ones included).
      record.weight_version =
          Micro(*owner, instruction.micro_batch, instruction.chunk).version;
    }
    trace_.Record(record);
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::RunCrossStep(StepState* current) {
  ScheduleParams params = params_;
  params.steps_before = steps_in_run_;
  params.last_step = false;
  // Stage 0 decides before its first forward whether the step ends the
  // run; the others follow the decision its activations carry, known once
  // their last forward of the step has run.
  if (is_first()) current->last_of_run = CommitStep(current->step);
  if (two_bw_) {
    // 2BW: a run's first two steps use its initial version; after that
    // each step uses the version its predecessor's predecessor produced
    // (one newer per step), i.e. W(t - 1) for step t.
    if (steps_in_run_ == 0) {
      two_bw_version_ = weight_version_.load();
    } else if (steps_in_run_ >= 2) {
      ++two_bw_version_;
    }
    current->version = two_bw_version_;
  }
  ASSIGN_OR_RETURN(std::vector<Instruction> steady,
                   BuildSchedule(params, config_.stage()));
  RETURN_IF_ERROR(RunInstructions(steady, 0, current));
  const bool last = current->last_of_run;
  if (!is_first()) FollowUpstream(current->step, last);
  if (!last) {
    ++steps_in_run_;
    return absl::OkStatus();
  }
  params.last_step = true;
  ASSIGN_OR_RETURN(std::vector<Instruction> full,
                   BuildSchedule(params, config_.stage()));
  RETURN_IF_ERROR(RunInstructions(full, steady.size(), current));
  steps_in_run_ = 0;
  stash_->SetFloor(-1);  // 2BW kept the last version for a next step
  return absl::OkStatus();
}

absl::Status StageExecutor::RunStep(int64_t step) {
  std::lock_guard<std::mutex> compute(compute_mu_);
  const auto start = Clock::now();
  const int m = params_.micro_batches;
  if (!cross_step_ || steps_in_run_ == 0) {
    // Cross-step schedules accumulate across the step boundary; their
    // updates start every accumulation afresh.
    ZeroGrads(all_params_);
    if (metrics_ != nullptr) metrics_->in_flight()->Set(0);
  }
  counters_ = StepCounters{
      0.0, 0.0, 0.0, 0.0, counters_.held_bytes, counters_.held_bytes};
  if (stash_ != nullptr) stash_->ResetPeak();
  auto inserted = in_flight_.emplace(step, std::make_unique<StepState>());
  StepState& state = *inserted.first->second;
  state.step = step;
  state.micro.resize(static_cast<size_t>(m) * num_chunks());
  state.pending = m * num_chunks();
  RETURN_IF_ERROR(cross_step_ ? RunCrossStep(&state)
                              : RunInstructions(schedule_, 0, &state));
  const double seconds = SecondsSince(start);
  v1::StepResult result;
  result.set_step(step);
  result.set_seconds(seconds);
  result.set_weight_version(weight_version_.load());
  if (order_ != nullptr) result.set_epoch(order_->EpochOfStep(step));
  if (is_last()) {
    // The last stage runs every backward of a step in its own stream
    // (its 1F1B warm-up is 0), so the step's loss is complete here.
    result.set_loss(state.loss.mean_loss());
    result.set_accuracy(state.loss.accuracy());
  }
  if (metrics_ != nullptr) {
    metrics_->steps()->Increment();
    metrics_->samples()->Increment(
        static_cast<double>(config_.spec().batch_size()));
    metrics_->weight_version()->Set(
        static_cast<double>(weight_version_.load()));
    metrics_->peak_activation_bytes()->Set(
        static_cast<double>(counters_.peak_bytes));
    if (is_last()) metrics_->loss()->Set(state.loss.mean_loss());
  }
  // Drop the steps whose micro-batches have all finished.
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    it = it->second->pending <= 0 ? in_flight_.erase(it) : std::next(it);
  }
  std::lock_guard<std::mutex> lock(mu_);
  results_.push_back(result);
  if (results_.size() > kMaxResults) results_.pop_front();
  timings_.forward_seconds = counters_.forward_seconds / m;
  timings_.backward_seconds = counters_.backward_seconds / m;
  timings_.idle_seconds = counters_.idle_seconds;
  timings_.optimizer_seconds = counters_.optimizer_seconds;
  timings_.step_seconds = seconds;
  timings_.peak_activation_bytes = counters_.peak_bytes;
  timings_.peak_stash_depth = stash_ != nullptr ? stash_->peak_depth() : 0;
  return absl::OkStatus();
}

absl::Status StageExecutor::Execute(const Instruction& in, StepState* state) {
  switch (in.op) {
    case OpKind::kLoadInput:
      return LoadInput(in.micro_batch, state);
    case OpKind::kRecvActivation:
      return ReceiveActivation(in.micro_batch, in.chunk, state);
    case OpKind::kForward:
      return Forward(in.micro_batch, in.chunk, state);
    case OpKind::kSendActivation:
      return SendActivation(in.micro_batch, in.chunk, state);
    case OpKind::kLoss:
      return Loss(in.micro_batch, in.chunk, state);
    case OpKind::kRecvGradient:
      return ReceiveGradient(in.micro_batch, in.chunk, state);
    case OpKind::kBackward:
      return Backward(in.micro_batch, in.chunk, state);
    case OpKind::kBackwardInput:
      return BackwardInput(in.micro_batch, in.chunk, state);
    case OpKind::kBackwardWeight:
      return BackwardWeight(in.micro_batch, in.chunk, state);
    case OpKind::kSendGradient:
      return SendGradient(in.micro_batch, in.chunk, state);
    case OpKind::kOptimizerStep:
      return OptimizerStep(state);
  }
  return absl::UnimplementedError(
      absl::StrCat(OpKindName(in.op), " is not supported by this executor"));
}

absl::Status StageExecutor::LoadInput(int mb, StepState* state) {
  if (state->inputs.empty()) {
    ASSIGN_OR_RETURN(Batch batch, TakeBatch(state->step));
    ASSIGN_OR_RETURN(state->inputs,
                     ShapeInputs(batch.inputs, models_.front()->input_shape()));
    state->labels = batch.labels;
  }
  const int64_t begin = mb * rows_per_micro_batch_;
  const int64_t end = begin + rows_per_micro_batch_;
  MicroBatch& micro = Micro(state, mb, 0);
  ASSIGN_OR_RETURN(Tensor x, state->inputs.SliceRows(begin, end));
  if (backend_->device() == Device::kCpu) {
    micro.input = x;  // host memory is the CPU backend's memory
  } else {
    ASSIGN_OR_RETURN(micro.input, ToDevice(backend_, x));
  }
  ASSIGN_OR_RETURN(micro.labels, state->labels.SliceRows(begin, end));
  counters_.Hold(micro.input.bytes());
  return absl::OkStatus();
}

absl::StatusOr<Batch> StageExecutor::TakeBatch(int64_t step) {
  auto gather = [this](int64_t s) {
    return GatherBatch(*data_.train, order_->IndicesForStep(s));
  };
  absl::StatusOr<Batch> batch;
  if (prefetch_step_ == step && prefetch_.valid()) {
    batch = prefetch_.get();
  } else {
    batch = gather(step);
  }
  prefetch_step_ = -1;
  if (step + 1 < until_step_.load()) {
    prefetch_ = std::async(std::launch::async, gather, step + 1);
    prefetch_step_ = step + 1;
  }
  return batch;
}

absl::StatusOr<StageMessage> StageExecutor::Receive(MessageKind kind,
                                                    int64_t step, int mb,
                                                    int chunk) {
  const auto start = Clock::now();
  const double timeout =
      config_.recv_timeout_s() > 0 ? config_.recv_timeout_s() : 120.0;
  auto msg =
      mailbox_.Receive(kind, step, mb, chunk,
                       start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(timeout)));
  const double idle = SecondsSince(start);
  counters_.idle_seconds += idle;
  if (metrics_ != nullptr) metrics_->idle_seconds()->Increment(idle);
  return msg;
}

absl::StatusOr<Tensor> StageExecutor::ToWire(const Tensor& t) {
  Tensor host = t;
  if (t.device() != Device::kCpu) {
    ASSIGN_OR_RETURN(host, ToHost(backend_, t));
  }
  return ConvertDType(host, FromProto(config_.wire_dtype()));
}

absl::StatusOr<Tensor> StageExecutor::FromWire(const Tensor& wire) {
  ASSIGN_OR_RETURN(Tensor f32, ConvertDType(wire, DType::kF32));
  if (backend_->device() == Device::kCpu) return f32;
  return ToDevice(backend_, f32);
}

absl::Status StageExecutor::ReceiveActivation(int mb, int chunk,
                                              StepState* state) {
  ASSIGN_OR_RETURN(StageMessage msg,
                   Receive(MessageKind::kActivation, state->step, mb, chunk));
  MicroBatch& micro = Micro(state, mb, chunk);
  ASSIGN_OR_RETURN(micro.input, FromWire(msg.tensors.at(0)));
  micro.labels = msg.tensors.at(1);
  if (cross_step_ && msg.value != 0.0) state->last_of_run = true;
  micro.version = weight_version_.load();
  if (config_.vertical_sync()) {
    // Stage 0's version for this micro-batch; later ones get it or newer.
    micro.version = msg.weight_version;
    stash_->SetFloor(msg.weight_version);
  }
  counters_.Hold(micro.input.bytes());
  return absl::OkStatus();
}

ForwardOptions StageExecutor::MicroBatchOptions(int64_t step, int mb) const {
  ForwardOptions options;
  options.dropout_seed = MicroBatchSeed(config_.spec().seed(), step, mb);
  return options;
}

absl::Status StageExecutor::Forward(int mb, int chunk, StepState* state) {
  const auto start = Clock::now();
  MicroBatch& micro = Micro(state, mb, chunk);
  const ForwardOptions options = MicroBatchOptions(state->step, mb);
  const bool keep = !config_.spec().rematerialize();
  if (two_bw_) {
    micro.version = state->version;  // double buffering: the step's version
  } else if (is_first() || !config_.vertical_sync()) {
    micro.version = weight_version_.load();
  }
  StashedWeights weights(stash_.get());
  if (stash_ != nullptr) {
    stash_->Pin(micro.version);
    RETURN_IF_ERROR(weights.Use(micro.version, weight_version_.load()));
  }
  ASSIGN_OR_RETURN(micro.output,
                   models_[chunk]->Forward(micro.input, options,
                                           keep ? &micro.contexts : nullptr));
  counters_.Hold(ContextBytes(micro.contexts) + micro.output.bytes());
  const double seconds = SecondsSince(start);
  counters_.forward_seconds += seconds;
  CountCompute(StageMetrics::kForward, seconds);
  if (metrics_ != nullptr) metrics_->in_flight()->Increment();
  return absl::OkStatus();
}

absl::Status StageExecutor::SendTo(const std::shared_ptr<StageLink>& link,
                                   StageMessage message) {
  if (link == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no link to send the ", MessageKindName(message.kind), " on"));
  }
  return link->Send(std::move(message));
}

absl::Status StageExecutor::SendActivation(int mb, int chunk,
                                           StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  StageMessage msg;
  msg.kind = MessageKind::kActivation;
  msg.step = state->step;
  msg.micro_batch = mb;
  // Virtual stage j's successor j + 1: the same chunk on the next worker,
  // or (wrapping from the last worker to worker 0) the next chunk.
  msg.chunk = is_last() ? chunk + 1 : chunk;
  msg.weight_version = micro.version;  // what vertical sync propagates
  msg.value = state->last_of_run ? 1.0 : 0.0;
  ASSIGN_OR_RETURN(Tensor wire, ToWire(micro.output));
  msg.tensors = {wire, micro.labels};
  counters_.held_bytes -= micro.output.bytes();
  micro.output = Tensor();
  return SendTo(downstream(), std::move(msg));
}

absl::Status StageExecutor::Loss(int mb, int chunk, StepState* state) {
  const auto start = Clock::now();
  MicroBatch& micro = Micro(state, mb, chunk);
  ASSIGN_OR_RETURN(Tensor labels, ToDevice(backend_, micro.labels));
  LayerContext ctx;
  ASSIGN_OR_RETURN(LossStats stats, loss_->Forward(micro.output, labels, &ctx));
  state->loss.Add(stats);
  // The loss is the mean over every label of the mini-batch (of the
  // micro-batch when every micro-batch is its own update).
  const int64_t rows = per_micro_batch_update_
                           ? labels.numel()
                           : labels.numel() * params_.micro_batches;
  const float scale = 1.0f / static_cast<float>(rows);
  ASSIGN_OR_RETURN(micro.grad_output, loss_->Backward(scale, &ctx));
  counters_.held_bytes -= micro.output.bytes();
  micro.output = Tensor();
  CountCompute(StageMetrics::kLoss, SecondsSince(start));
  return absl::OkStatus();
}

absl::Status StageExecutor::ReceiveGradient(int mb, int chunk,
                                            StepState* state) {
  ASSIGN_OR_RETURN(StageMessage msg,
                   Receive(MessageKind::kGradient, state->step, mb, chunk));
  ASSIGN_OR_RETURN(Micro(state, mb, chunk).grad_output,
                   FromWire(msg.tensors.at(0)));
  return absl::OkStatus();
}

absl::Status StageExecutor::Recompute(int mb, int chunk,
                                      const ForwardOptions& options,
                                      StepState* state) {
  if (!config_.spec().rematerialize()) return absl::OkStatus();
  // Re-materialization: recompute this micro-batch's forward from the
  // stage input it kept, just before its backward.
  const auto start = Clock::now();
  MicroBatch& micro = Micro(state, mb, chunk);
  RETURN_IF_ERROR(
      models_[chunk]->Forward(micro.input, options, &micro.contexts).status());
  counters_.Hold(ContextBytes(micro.contexts));
  const double seconds = SecondsSince(start);
  counters_.forward_seconds += seconds;
  CountCompute(StageMetrics::kRecompute, seconds);
  return absl::OkStatus();
}

absl::Status StageExecutor::Backward(int mb, int chunk, StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  const ForwardOptions options = MicroBatchOptions(state->step, mb);
  // Weight stashing: recompute and backward with the forward's weights.
  StashedWeights weights(stash_.get());
  if (stash_ != nullptr) {
    RETURN_IF_ERROR(weights.Use(micro.version, weight_version_.load()));
  }
  RETURN_IF_ERROR(Recompute(mb, chunk, options, state));
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(
      micro.grad_input,
      models_[chunk]->Backward(micro.grad_output, options, &micro.contexts,
                               !IsFirstVirtual(chunk)));
  counters_.held_bytes -= ContextBytes(micro.contexts) + micro.input.bytes();
  micro.contexts.clear();
  micro.input = Tensor();
  micro.grad_output = Tensor();
  const double seconds = SecondsSince(start);
  counters_.backward_seconds += seconds;
  CountCompute(StageMetrics::kBackward, seconds);
  if (metrics_ != nullptr) metrics_->in_flight()->Decrement();
  --state->pending;
  if (stash_ != nullptr) {
    weights.Restore();
    stash_->Unpin(micro.version);
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::BackwardInput(int mb, int chunk, StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  const ForwardOptions options = MicroBatchOptions(state->step, mb);
  RETURN_IF_ERROR(Recompute(mb, chunk, options, state));
  const auto start = Clock::now();
  const int64_t forward_bytes = ContextBytes(micro.contexts);
  ASSIGN_OR_RETURN(
      micro.grad_input,
      models_[chunk]->BackwardInput(micro.grad_output, options, &micro.contexts,
                                    !IsFirstVirtual(chunk)));
  // B drops the activations W does not need and keeps (e.g.) each linear
  // layer's input and output gradient until W.
  counters_.held_bytes -= forward_bytes + micro.input.bytes();
  counters_.Hold(ContextBytes(micro.contexts));
  micro.input = Tensor();
  micro.grad_output = Tensor();
  const double seconds = SecondsSince(start);
  counters_.backward_seconds += seconds;
  CountCompute(StageMetrics::kBackward, seconds);
  return absl::OkStatus();
}

absl::Status StageExecutor::BackwardWeight(int mb, int chunk,
                                           StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  const auto start = Clock::now();
  const int64_t held = ContextBytes(micro.contexts);
  RETURN_IF_ERROR(models_[chunk]->BackwardWeight(
      MicroBatchOptions(state->step, mb), &micro.contexts));
  counters_.held_bytes -= held;
  micro.contexts.clear();
  const double seconds = SecondsSince(start);
  counters_.backward_seconds += seconds;
  CountCompute(StageMetrics::kBackward, seconds);
  if (metrics_ != nullptr) metrics_->in_flight()->Decrement();
  --state->pending;
  return absl::OkStatus();
}

absl::Status StageExecutor::SendGradient(int mb, int chunk, StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  StageMessage msg;
  msg.kind = MessageKind::kGradient;
  msg.step = state->step;
  msg.micro_batch = mb;
  // Virtual stage j's predecessor j - 1 (wrapping from worker 0 to the
  // last worker's previous chunk).
  msg.chunk = is_first() ? chunk - 1 : chunk;
  msg.weight_version = weight_version_.load();
  ASSIGN_OR_RETURN(Tensor wire, ToWire(micro.grad_input));
  msg.tensors = {wire};
  micro.grad_input = Tensor();
  return SendTo(upstream(), std::move(msg));
}

absl::StatusOr<double> StageExecutor::GlobalSumSquares(double local,
                                                       int64_t step) {
  // Partial sums flow up from the last stage; the total flows back down.
  double partial = local;
  if (!is_last()) {
    ASSIGN_OR_RETURN(StageMessage msg,
                     Receive(MessageKind::kNormPartial, step, 0, 0));
    partial += msg.value;
  }
  if (!is_first()) {
    StageMessage up;
    up.kind = MessageKind::kNormPartial;
    up.step = step;
    up.value = partial;
    RETURN_IF_ERROR(SendTo(upstream(), std::move(up)));
  }
  double total = partial;
  if (!is_first()) {
    ASSIGN_OR_RETURN(StageMessage msg,
                     Receive(MessageKind::kNormTotal, step, 0, 0));
    total = msg.value;
  }
  if (!is_last()) {
    StageMessage down;
    down.kind = MessageKind::kNormTotal;
    down.step = step;
    down.value = total;
    RETURN_IF_ERROR(SendTo(downstream(), std::move(down)));
  }
  return total;
}

absl::Status StageExecutor::OptimizerStep(StepState* state) {
  const auto start = Clock::now();
  float scale = 1.0f;
  const float clip = optimizer_->clip_grad_norm();
  if (clip > 0) {
    ASSIGN_OR_RETURN(double local, GradSumSquares(backend_, all_params_));
    ASSIGN_OR_RETURN(double total, GlobalSumSquares(local, state->step));
    scale = ClipScale(total, clip);
  }
  if (stash_ != nullptr) {
    // 2BW: the version being replaced is the one the next step uses.
    if (two_bw_) stash_->SetFloor(weight_version_.load());
    RETURN_IF_ERROR(stash_->BeforeUpdate(weight_version_.load()));
  }
  RETURN_IF_ERROR(optimizer_->Step(all_params_, scale));
  ++weight_version_;
  const double seconds = SecondsSince(start);
  counters_.optimizer_seconds += seconds;
  CountCompute(StageMetrics::kOptimizer, seconds);
  return absl::OkStatus();
}

v1::GetStatusResponse StageExecutor::GetStatus(int64_t results_since) const {
  v1::GetStatusResponse out;
  std::lock_guard<std::mutex> lock(mu_);
  out.set_state(state_);
  out.set_next_step(next_step_.load());
  out.set_weight_version(weight_version_.load());
  if (!error_.ok()) {
    out.set_error(error_.ToString());
    out.set_error_code(static_cast<int>(error_.code()));
  }
  for (const v1::StepResult& r : results_) {
    if (r.step() >= results_since) *out.add_results() = r;
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
  std::lock_guard<std::mutex> lock(mu_);
  return timings_;
}

absl::StatusOr<v1::GetWeightsResponse> StageExecutor::Weights() {
  std::lock_guard<std::mutex> compute(compute_mu_);
  v1::GetWeightsResponse out;
  out.set_weight_version(weight_version_.load());
  for (const std::unique_ptr<Model>& model : models_) {
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
