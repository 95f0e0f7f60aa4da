#include "worker/pipeline/stage_host.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "spec/profile_scale.h"
#include "worker/pipeline/profiler.h"
#include "worker/pipeline/stage_config.h"

namespace pipetrain {

StageHost::StageHost(std::unique_ptr<Backend> backend, StageMetrics* metrics,
                     DownstreamOpener open_downstream, double compute_share)
    : backend_(std::move(backend)),
      metrics_(metrics),
      open_downstream_(std::move(open_downstream)),
      compute_share_(compute_share > 0 && compute_share < 1 ? compute_share
                                                            : 1.0) {}

StageHost::~StageHost() { Shutdown(); }

void StageHost::Shutdown() { DropCurrent(); }

void StageHost::DropCurrent() {
  std::shared_ptr<StageExecutor> executor;
  std::shared_ptr<DownstreamLink> downstream;
  {
    absl::MutexLock lock(&mu_);
    executor = std::move(executor_);
    downstream = std::move(downstream_);
  }
  // Outside mu_: stopping joins the training thread, closing waits for the
  // transport, and neither may wait on a caller that holds mu_.
  if (executor != nullptr) executor->Stop();
  if (downstream != nullptr) downstream->Close();
  if (metrics_ != nullptr) {
    metrics_->stage_index()->Set(-1);
    metrics_->theoretical_bubble()->Set(0);
  }
}

std::string StageHost::UpstreamIdentity() const {
  absl::MutexLock lock(&mu_);
  return executor_ == nullptr ? std::string()
                              : executor_->config().upstream_identity();
}

absl::StatusOr<std::shared_ptr<StageExecutor>> StageHost::Executor(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  if (executor_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no stage configured (call Configure first)");
  }
  if (executor_->config().job_id() != job_id) {
    return absl::NotFoundError(
        absl::StrCat("unknown job '", job_id, "' (this worker runs job '",
                     executor_->config().job_id(), "')"));
  }
  return executor_;
}

absl::StatusOr<v1::ConfigureResponse> StageHost::Configure(
    const v1::StageConfig& config) {
  // Everything checkable is checked before the running stage is touched: a
  // rejected Configure leaves the job running.
  RETURN_IF_ERROR(ValidateStageConfig(config));
  DropCurrent();
  ASSIGN_OR_RETURN(std::unique_ptr<StageExecutor> created,
                   StageExecutor::Create(config, backend_.get(), metrics_));
  std::shared_ptr<StageExecutor> executor = std::move(created);
  v1::ConfigureResponse response;
  response.set_num_parameters(executor->num_parameters());
  for (int64_t d : executor->input_shape()) response.add_input_shape(d);
  for (int64_t d : executor->output_shape()) response.add_output_shape(d);
  response.set_steps_per_epoch(executor->steps_per_epoch());
  PT_LOG(INFO) << "configured stage " << config.stage() << "/"
               << config.num_stages() << " of job " << config.job_id()
               << ": layers [" << config.layer_begin() << ", "
               << config.layer_end() << "), " << executor->num_parameters()
               << " parameters on " << backend_->Describe();
  absl::MutexLock lock(&mu_);
  executor_ = std::move(executor);
  return response;
}

absl::Status StageHost::EnsureDownstream(
    const std::shared_ptr<StageExecutor>& executor) {
  // Interleaved: the last stage too (its wrap-around link to stage 0).
  if (!executor->needs_downstream()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (executor_ != executor) {
    return absl::AbortedError("the stage was replaced while starting");
  }
  if (downstream_ != nullptr) return absl::OkStatus();
  if (open_downstream_ == nullptr) {
    return absl::FailedPreconditionError(
        "stage needs a next stage but this worker cannot open links");
  }
  downstream_ = open_downstream_(executor->config().downstream(), executor);
  executor->SetDownstream(downstream_);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StageHost::Train(const std::string& job_id,
                                         int64_t until_step) {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  RETURN_IF_ERROR(EnsureDownstream(executor));
  return executor->Train(until_step);
}

absl::Status StageHost::Stop(const std::string& job_id) {
  RETURN_IF_ERROR(Executor(job_id).status());
  DropCurrent();
  return absl::OkStatus();
}

absl::StatusOr<v1::GetStatusResponse> StageHost::Status(
    const std::string& job_id, int64_t results_since) const {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  return executor->GetStatus(results_since);
}

std::optional<v1::StageReport> StageHost::Report(int64_t results_since) const {
  std::shared_ptr<StageExecutor> executor;
  {
    absl::MutexLock lock(&mu_);
    executor = executor_;
  }
  if (executor == nullptr) return std::nullopt;
  v1::StageReport report;
  report.set_job_id(executor->config().job_id());
  report.set_stage(executor->config().stage());
  report.set_attempt(executor->config().attempt());
  *report.mutable_status() = executor->GetStatus(results_since);
  return report;
}

absl::StatusOr<v1::GetWeightsResponse> StageHost::Weights(
    const std::string& job_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  return executor->Weights();
}

absl::StatusOr<v1::GetTraceResponse> StageHost::Trace(
    const std::string& job_id, int64_t since_step) const {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  return executor->Trace(since_step);
}

absl::StatusOr<v1::EvaluateStageResponse> StageHost::Evaluate(
    const std::string& job_id, int64_t max_samples) {
  if (max_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_samples: ", max_samples,
                     " must be >= 0 (0 = the whole held-out split)"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  RETURN_IF_ERROR(EnsureDownstream(executor));
  v1::EvaluateStageResponse response;
  // Only the last stage computes a result; the others return an empty one.
  ASSIGN_OR_RETURN(*response.mutable_result(), executor->Evaluate(max_samples));
  return response;
}

absl::StatusOr<int64_t> StageHost::Snapshot(const std::string& job_id,
                                            int64_t step) {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  return executor->Snapshot(step);
}

absl::StatusOr<std::shared_ptr<const StageStateSnapshot>>
StageHost::FetchSnapshot(const std::string& job_id, int64_t step) const {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  return executor->FetchSnapshot(step);
}

absl::StatusOr<std::unique_ptr<StateAssembler>> StageHost::StartRestore(
    const std::string& job_id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor, Executor(job_id));
  return std::make_unique<StateAssembler>(job_id, executor->state_layout());
}

absl::StatusOr<v1::RestoreStateResponse> StageHost::RestoreState(
    const std::string& job_id, const TrainingState& state) {
  std::shared_ptr<StageExecutor> executor;
  if (job_id.empty()) {
    absl::MutexLock lock(&mu_);
    executor = executor_;
    if (executor == nullptr) {
      return absl::FailedPreconditionError(
          "this worker has no stage configured (call Configure first)");
    }
  } else {
    ASSIGN_OR_RETURN(executor, Executor(job_id));
  }
  RETURN_IF_ERROR(executor->RestoreState(state));
  v1::RestoreStateResponse response;
  int64_t loaded = 0;
  for (const auto& [name, tensor] : state.tensors) {
    loaded += executor->state_layout().tensors().count(name);
  }
  response.set_tensors(loaded);
  PT_LOG(INFO) << "restored stage " << executor->config().stage() << " of job "
               << executor->config().job_id() << ": " << loaded
               << " tensors, optimizer steps " << state.optimizer_steps
               << ", next step " << executor->next_step();
  return response;
}

absl::StatusOr<v1::ProfileResponse> StageHost::Profile(
    const v1::ProfileRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    // Only the state matters: ask for no step results.
    if (executor_ != nullptr &&
        executor_->GetStatus(std::numeric_limits<int64_t>::max()).state() ==
            v1::STAGE_STATE_RUNNING) {
      return absl::FailedPreconditionError(
          "cannot profile while a stage is training");
    }
  }
  ASSIGN_OR_RETURN(v1::ProfileResponse response,
                   ProfileLayers(request.spec(), request.batch(),
                                 request.repetitions(), backend_.get(),
                                 request.fastest(), request.reuse_weights()));
  ScaleLayerTimes(1.0 / compute_share_, &response);
  return response;
}

}  // namespace pipetrain
