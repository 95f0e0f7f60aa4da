#include "worker/pipeline/stage_compute.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/elapsed.h"
#include "common/status_macros.h"
#include "spec/schedule.h"
#include "worker/pipeline/gradient_norm.h"
#include "worker/pipeline/micro_batch.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

// How long a drain's receive waits before running weight-gradient products
// ahead: a gradient due any moment comes first, and the products fill only
// the longer waits.
constexpr auto kRunAheadAfter = std::chrono::milliseconds(1);
// The fewest held rows not yet run that a layer runs ahead: each run ahead
// costs the flush another pass over the layer's gradient (it reads the
// sums back), which pays only for enough rows.
constexpr int64_t kRunAheadRows = WeightGradQueue::kMaxRows / 2;

}  // namespace

StageCompute::StageCompute(const v1::StageConfig& config, StageSetup setup,
                           Backend* backend, StageMetrics* metrics,
                           StagePort* port, const StageOptions& options)
    : config_(config),
      setup_(std::move(setup)),
      backend_(backend),
      metrics_(metrics),
      port_(port),
      options_(options) {}

absl::StatusOr<std::unique_ptr<StageCompute>> StageCompute::Create(
    const v1::StageConfig& config, StageSetup setup, Backend* backend,
    StageMetrics* metrics, StagePort* port, const StageOptions& options) {
  std::unique_ptr<StageCompute> compute(new StageCompute(
      config, std::move(setup), backend, metrics, port, options));
  RETURN_IF_ERROR(compute->Build());
  return compute;
}

absl::Status StageCompute::Build() {
  const v1::TrainingSpec& spec = config_.spec();
  for (const LayerSpan& span : setup_.spans) {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                     Model::Build(spec.model(), span.begin, span.end, backend_,
                                  spec.seed()));
    all_params_.insert(all_params_.end(), model->params().begin(),
                       model->params().end());
    models_.push_back(std::move(model));
  }
  if (!setup_.initial_weights.empty()) RETURN_IF_ERROR(LoadInitialWeights());
  ASSIGN_OR_RETURN(optimizer_, Optimizer::Create(spec.optimizer(), backend_));
  if (setup_.cross_step) {
    stash_ = std::make_unique<WeightStash>(backend_, all_params_);
  } else if (ReusesWeights(setup_.params.kind, setup_.params.micro_batches)) {
    // Synchronous: the weights multiply every micro-batch of a step
    // unchanged, so they are laid out for the GEMM once a step rather than
    // in every product.
    for (auto& model : models_) model->ReuseWeights(true);
    reuses_weights_ = true;
    // The weight gradients of several micro-batches are taken in one
    // product (Model::DeferWeightGrads), flushed before the update.
    if (DefersWeightGrads(setup_.params.kind, setup_.params.micro_batches,
                          spec.rematerialize())) {
      for (auto& model : models_) model->DeferWeightGrads(true);
    }
  }
  if (is_last()) loss_ = std::make_unique<SoftmaxCrossEntropyLoss>(backend_);
  const DataParts parts = StageDataParts(config_);
  if (parts.any()) {
    ASSIGN_OR_RETURN(
        data_, StageData::Open(spec, parts, models_.front()->input_shape()));
  }
  // Versions count optimizer steps: M per step under the async schedule.
  weight_version_ = setup_.per_micro_batch_update
                        ? config_.start_step() * setup_.params.micro_batches
                        : config_.start_step();
  return absl::OkStatus();
}

absl::Status StageCompute::LoadInitialWeights() {
  const std::vector<Tensor>& weights = setup_.initial_weights;
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

int64_t StageCompute::DeferredBytes() const {
  int64_t bytes = 0;
  for (const auto& model : models_) {
    bytes += model->deferred_weight_grad_bytes();
  }
  return bytes;
}

void StageCompute::StartStep() {
  // Products still held come from a step that did not reach its update.
  counters_.held_bytes -= DeferredBytes();
  for (auto& model : models_) model->DiscardWeightGrads();
  counters_ = StepCounters{
      0.0, 0.0, 0.0, 0.0, counters_.held_bytes, counters_.held_bytes};
  if (stash_ != nullptr) stash_->ResetPeak();
}

MicroBatch& StageCompute::Micro(StepState* state, int mb, int chunk) const {
  return state
      ->micro[static_cast<size_t>(chunk) * setup_.params.micro_batches + mb];
}

void StageCompute::CountCompute(StageMetrics::Phase phase,
                                double seconds) const {
  if (metrics_ != nullptr) metrics_->compute_seconds(phase)->Increment(seconds);
}

ForwardOptions StageCompute::MicroBatchOptions(int64_t step, int mb) const {
  ForwardOptions options;
  options.dropout_seed = MicroBatchSeed(config_.spec().seed(), step, mb);
  return options;
}

absl::StatusOr<Tensor> StageCompute::HostCopy(const Tensor& tensor) const {
  if (tensor.device() == Device::kCpu) return tensor;
  return ToHost(backend_, tensor);
}

absl::StatusOr<Tensor> StageCompute::OnBackend(const Tensor& host) const {
  // Host memory is the CPU backend's memory.
  if (backend_->device() == Device::kCpu) return host;
  return ToDevice(backend_, host);
}

absl::Status StageCompute::RecordUse(int chunk, int64_t version,
                                     WeightUse* use) const {
  use->recorded = true;
  use->version = version;
  if (options_.checksum_weights) {
    ASSIGN_OR_RETURN(use->checksum,
                     ParamsChecksum(backend_, models_[chunk]->params()));
  }
  return absl::OkStatus();
}

int64_t StageCompute::WeightGradBytesRun() const {
  int64_t bytes = 0;
  for (const auto& model : models_) bytes += model->weight_grad_bytes_run();
  return bytes;
}

absl::Status StageCompute::Execute(const Instruction& in, StepState* state,
                                   WeightUse* use) {
  const int mb = in.micro_batch;
  switch (in.op) {
    case OpKind::kLoadInput:
      return LoadInput(mb, state);
    case OpKind::kRecvActivation:
      return ReceiveActivation(mb, in.chunk, state);
    case OpKind::kForward:
      return Forward(mb, in.chunk, state, use);
    case OpKind::kSendActivation:
      return SendActivation(mb, in.chunk, state);
    case OpKind::kLoss:
      return Loss(mb, in.chunk, state);
    case OpKind::kRecvGradient:
      return ReceiveGradient(mb, in.chunk, state);
    case OpKind::kBackward:
      return Backward(mb, in.chunk, state, use);
    case OpKind::kBackwardInput:
      return BackwardInput(mb, in.chunk, state, use);
    case OpKind::kBackwardWeight:
      return BackwardWeight(mb, in.chunk, state);
    case OpKind::kSendGradient:
      return SendGradient(mb, in.chunk, state);
    case OpKind::kOptimizerStep:
      return OptimizerStep(state);
  }
  return absl::UnimplementedError(
      absl::StrCat(OpKindName(in.op), " is not supported by this executor"));
}

absl::Status StageCompute::LoadInput(int mb, StepState* state) {
  if (state->inputs.empty()) {
    // A one-stage pipeline reads the labels with the inputs.
    ASSIGN_OR_RETURN(Batch batch,
                     data_->TrainBatch(state->step, state->read_ahead));
    state->inputs = batch.inputs;
    state->labels = batch.labels;
  }
  const int64_t rows = setup_.rows_per_micro_batch;
  const int64_t begin = mb * rows;
  MicroBatch& micro = Micro(state, mb, 0);
  ASSIGN_OR_RETURN(Tensor x, state->inputs.SliceRows(begin, begin + rows));
  ASSIGN_OR_RETURN(micro.input, OnBackend(x));
  micro.data_samples = data_->train_size();
  counters_.Hold(micro.input.bytes());
  return absl::OkStatus();
}

absl::Status StageCompute::PrepareWhileWaiting(MessageKind kind, int64_t step,
                                               int mb, int chunk) {
  // The pass that needs a stale copy packs it anyway, so packing it in a
  // wait costs nothing, even when the message arrives meanwhile.
  if (!reuses_weights_ || port_->mailbox()->Ready(kind, step, mb, chunk)) {
    return absl::OkStatus();
  }
  const auto start = Clock::now();
  for (auto& model : models_) RETURN_IF_ERROR(model->PrepareWeights());
  CountCompute(StageMetrics::kPack, SecondsSince(start));
  return absl::OkStatus();
}

absl::Status StageCompute::ReceiveActivation(int mb, int chunk,
                                             StepState* state) {
  RETURN_IF_ERROR(
      PrepareWhileWaiting(MessageKind::kActivation, state->step, mb, chunk));
  ASSIGN_OR_RETURN(StageMessage msg,
                   port_->Receive(MessageKind::kActivation, state->step, mb,
                                  chunk, &counters_.idle_seconds));
  MicroBatch& micro = Micro(state, mb, chunk);
  ASSIGN_OR_RETURN(micro.input, OnBackend(msg.tensors.at(0)));
  micro.data_samples = msg.samples;
  if (setup_.cross_step && msg.value != 0.0) {
    state->end = static_cast<StepEnd>(static_cast<int>(msg.value));
  }
  micro.version = weight_version_.load();
  if (config_.vertical_sync()) {
    // Stage 0's version for this micro-batch; later ones get it or newer.
    micro.version = msg.weight_version;
    stash_->SetFloor(msg.weight_version);
  }
  counters_.Hold(micro.input.bytes());
  return absl::OkStatus();
}

absl::Status StageCompute::Forward(int mb, int chunk, StepState* state,
                                   WeightUse* use) {
  const auto start = Clock::now();
  MicroBatch& micro = Micro(state, mb, chunk);
  const ForwardOptions options = MicroBatchOptions(state->step, mb);
  const bool keep = !config_.spec().rematerialize();
  if (setup_.two_bw) {
    micro.version = state->version;  // double buffering: the step's version
  } else if (is_first() || !config_.vertical_sync()) {
    micro.version = weight_version_.load();
  }
  StashedWeights weights(stash_.get());
  if (stash_ != nullptr) {
    stash_->Pin(micro.version);
    RETURN_IF_ERROR(weights.Use(micro.version, weight_version_.load()));
  }
  RETURN_IF_ERROR(RecordUse(chunk, micro.version, use));
  ASSIGN_OR_RETURN(micro.output,
                   models_[chunk]->Forward(micro.input, options,
                                           keep ? &micro.contexts : nullptr));
  counters_.Hold(ContextBytes(micro.contexts) + micro.output.bytes());
  ++state->forwards;
  const double seconds = SecondsSince(start);
  counters_.forward_seconds += seconds;
  CountCompute(StageMetrics::kForward, seconds);
  if (metrics_ != nullptr) metrics_->in_flight()->Increment();
  return absl::OkStatus();
}

absl::Status StageCompute::SendActivation(int mb, int chunk, StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  StageMessage msg;
  msg.kind = MessageKind::kActivation;
  msg.step = state->step;
  msg.micro_batch = mb;
  msg.chunk = DownstreamChunk(chunk);
  msg.weight_version = micro.version;  // what vertical sync propagates
  msg.value = static_cast<double>(static_cast<int>(state->end));
  msg.samples = micro.data_samples;
  ASSIGN_OR_RETURN(Tensor output, HostCopy(micro.output));
  msg.tensors = {output};
  counters_.held_bytes -= micro.output.bytes();
  micro.output = Tensor();
  return port_->SendDownstream(std::move(msg));
}

absl::StatusOr<Tensor> StageCompute::Labels(int mb, int chunk,
                                            StepState* state) {
  RETURN_IF_ERROR(data_->CheckUpstreamSize(Micro(state, mb, chunk).data_samples,
                                           /*eval=*/false));
  if (state->labels.empty()) {
    ASSIGN_OR_RETURN(Batch batch,
                     data_->TrainBatch(state->step, state->read_ahead));
    state->labels = batch.labels;
  }
  const int64_t rows = setup_.rows_per_micro_batch;
  return state->labels.SliceRows(mb * rows, (mb + 1) * rows);
}

absl::Status StageCompute::Loss(int mb, int chunk, StepState* state) {
  const auto start = Clock::now();
  MicroBatch& micro = Micro(state, mb, chunk);
  ASSIGN_OR_RETURN(Tensor host_labels, Labels(mb, chunk, state));
  ASSIGN_OR_RETURN(Tensor labels, ToDevice(backend_, host_labels));
  LayerContext ctx;
  ASSIGN_OR_RETURN(LossStats stats, loss_->Forward(micro.output, labels, &ctx));
  state->loss.Add(stats);
  // The loss is the mean over every label of the mini-batch (of the
  // micro-batch when every micro-batch is its own update).
  const int64_t rows = setup_.per_micro_batch_update
                           ? labels.numel()
                           : labels.numel() * setup_.params.micro_batches;
  const float scale = 1.0f / static_cast<float>(rows);
  ASSIGN_OR_RETURN(micro.grad_output, loss_->Backward(scale, &ctx));
  counters_.held_bytes -= micro.output.bytes();
  micro.output = Tensor();
  CountCompute(StageMetrics::kLoss, SecondsSince(start));
  return absl::OkStatus();
}

absl::Status StageCompute::ReceiveGradient(int mb, int chunk,
                                           StepState* state) {
  RETURN_IF_ERROR(
      PrepareWhileWaiting(MessageKind::kGradient, state->step, mb, chunk));
  RETURN_IF_ERROR(RunWeightPassWhileWaiting(mb, chunk, *state));
  ASSIGN_OR_RETURN(StageMessage msg,
                   port_->Receive(MessageKind::kGradient, state->step, mb,
                                  chunk, &counters_.idle_seconds));
  ASSIGN_OR_RETURN(Micro(state, mb, chunk).grad_output,
                   OnBackend(msg.tensors.at(0)));
  return absl::OkStatus();
}

absl::Status StageCompute::RunWeightPassWhileWaiting(int mb, int chunk,
                                                     const StepState& state) {
  if (state.forwards < static_cast<int>(state.micro.size()) ||
      DeferredBytes() == 0) {
    return absl::OkStatus();
  }
  if (port_->WaitFor(MessageKind::kGradient, state.step, mb, chunk,
                     kRunAheadAfter, &counters_.idle_seconds)) {
    return absl::OkStatus();
  }
  const Mailbox* mailbox = port_->mailbox();
  const auto start = Clock::now();
  bool ran = false;
  for (bool more = true; more && !mailbox->Ready(MessageKind::kGradient,
                                                 state.step, mb, chunk);) {
    more = false;
    for (auto& model : models_) {
      ASSIGN_OR_RETURN(more, model->RunWeightGradsAhead(kRunAheadRows));
      if (more) break;
    }
    ran = ran || more;
  }
  // The rows stay held until the flush: no held bytes are released here.
  if (ran) CountWeightPass(/*deferred=*/0, SecondsSince(start));
  return absl::OkStatus();
}

absl::Status StageCompute::Recompute(int mb, int chunk,
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

absl::Status StageCompute::Backward(int mb, int chunk, StepState* state,
                                    WeightUse* use) {
  MicroBatch& micro = Micro(state, mb, chunk);
  const ForwardOptions options = MicroBatchOptions(state->step, mb);
  // Weight stashing: recompute and backward with the forward's weights.
  StashedWeights weights(stash_.get());
  if (stash_ != nullptr) {
    RETURN_IF_ERROR(weights.Use(micro.version, weight_version_.load()));
  }
  RETURN_IF_ERROR(RecordUse(chunk, micro.version, use));
  RETURN_IF_ERROR(Recompute(mb, chunk, options, state));
  const auto start = Clock::now();
  const int64_t deferred = DeferredBytes();
  ASSIGN_OR_RETURN(
      micro.grad_input,
      models_[chunk]->Backward(micro.grad_output, options, &micro.contexts,
                               !IsFirstVirtual(chunk)));
  counters_.held_bytes -= ContextBytes(micro.contexts) + micro.input.bytes();
  counters_.Hold(DeferredBytes() - deferred);
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

absl::Status StageCompute::BackwardInput(int mb, int chunk, StepState* state,
                                         WeightUse* use) {
  MicroBatch& micro = Micro(state, mb, chunk);
  const ForwardOptions options = MicroBatchOptions(state->step, mb);
  RETURN_IF_ERROR(RecordUse(chunk, micro.version, use));
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

absl::Status StageCompute::BackwardWeight(int mb, int chunk, StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  const auto start = Clock::now();
  const int64_t held = ContextBytes(micro.contexts);
  const int64_t deferred = DeferredBytes();
  RETURN_IF_ERROR(models_[chunk]->BackwardWeight(
      MicroBatchOptions(state->step, mb), &micro.contexts));
  counters_.held_bytes -= held;
  counters_.Hold(DeferredBytes() - deferred);
  micro.contexts.clear();
  const double seconds = SecondsSince(start);
  counters_.backward_seconds += seconds;
  CountCompute(StageMetrics::kWeight, seconds);
  if (metrics_ != nullptr) metrics_->in_flight()->Decrement();
  --state->pending;
  return absl::OkStatus();
}

absl::Status StageCompute::SendGradient(int mb, int chunk, StepState* state) {
  MicroBatch& micro = Micro(state, mb, chunk);
  StageMessage msg;
  msg.kind = MessageKind::kGradient;
  msg.step = state->step;
  msg.micro_batch = mb;
  msg.chunk = UpstreamChunk(chunk);
  msg.weight_version = weight_version_.load();
  ASSIGN_OR_RETURN(Tensor grad, HostCopy(micro.grad_input));
  msg.tensors = {grad};
  micro.grad_input = Tensor();
  return port_->SendUpstream(std::move(msg));
}

absl::Status StageCompute::FlushWeightGrads() {
  const int64_t deferred = DeferredBytes();
  if (deferred == 0) return absl::OkStatus();
  const auto start = Clock::now();
  for (auto& model : models_) RETURN_IF_ERROR(model->FlushWeightGrads());
  CountWeightPass(deferred, SecondsSince(start));
  return absl::OkStatus();
}

void StageCompute::CountWeightPass(int64_t deferred, double seconds) {
  counters_.held_bytes -= deferred;
  counters_.backward_seconds += seconds;
  CountCompute(StageMetrics::kWeight, seconds);
}

void StageCompute::CountUpdate(double seconds) {
  ++weight_version_;
  counters_.optimizer_seconds += seconds;
  CountCompute(StageMetrics::kOptimizer, seconds);
}

absl::Status StageCompute::UpdateLayerByLayer() {
  const int64_t deferred = DeferredBytes();
  double weight = 0, update = 0, pack = 0;
  optimizer_->StartStep();
  for (auto model = models_.rbegin(); model != models_.rend(); ++model) {
    for (int i = (*model)->num_layers(); i-- > 0;) {
      Layer* layer = (*model)->layer(i);
      const std::vector<Param*> params = layer->params();
      if (params.empty()) continue;
      auto start = Clock::now();
      RETURN_IF_ERROR((*model)->FlushWeightGradsFor(params));
      weight += SecondsSince(start);
      start = Clock::now();
      RETURN_IF_ERROR(optimizer_->Update(params, 1.0f));
      update += SecondsSince(start);
      if (!reuses_weights_) continue;
      start = Clock::now();
      RETURN_IF_ERROR(layer->PrepareWeights(PackedCopies::kForward));
      pack += SecondsSince(start);
    }
  }
  if (deferred > 0) CountWeightPass(deferred, weight);
  if (reuses_weights_) CountCompute(StageMetrics::kPack, pack);
  CountUpdate(update);
  return absl::OkStatus();
}

absl::Status StageCompute::OptimizerStep(StepState* state) {
  const float clip = optimizer_->clip_grad_norm();
  if (clip <= 0 && stash_ == nullptr) return UpdateLayerByLayer();
  RETURN_IF_ERROR(FlushWeightGrads());
  const auto start = Clock::now();
  float scale = 1.0f;
  if (clip > 0) {
    ASSIGN_OR_RETURN(double local, GradSumSquares(backend_, all_params_));
    ASSIGN_OR_RETURN(
        double total,
        AllReduceSumSquares(local, state->step, is_first(), is_last(), port_,
                            &counters_.idle_seconds));
    scale = ClipScale(total, clip);
  }
  if (stash_ != nullptr) {
    // 2BW: the version being replaced is the one the next step uses.
    if (setup_.two_bw) stash_->SetFloor(weight_version_.load());
    RETURN_IF_ERROR(stash_->BeforeUpdate(weight_version_.load()));
  }
  RETURN_IF_ERROR(optimizer_->Step(all_params_, scale));
  CountUpdate(SecondsSince(start));
  return absl::OkStatus();
}

}  // namespace pipetrain
