#include "services/worker/stage_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"
#include "services/worker/stage_streams.h"
#include "worker/pipeline/profiler.h"

namespace pipetrain {

StageServiceImpl::StageServiceImpl(std::unique_ptr<Backend> backend,
                                   StageMetrics* metrics,
                                   StageServiceOptions options)
    : backend_(std::move(backend)), metrics_(metrics), options_(options) {}

StageServiceImpl::~StageServiceImpl() { Shutdown(); }

void StageServiceImpl::Shutdown() { DropCurrent(); }

void StageServiceImpl::DropCurrent() {
  std::shared_ptr<StageExecutor> executor;
  std::shared_ptr<DownstreamStream> downstream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    executor = std::move(executor_);
    downstream = std::move(downstream_);
  }
  if (executor != nullptr) executor->Stop();
  if (downstream != nullptr) downstream->Close();
  if (metrics_ != nullptr) {
    metrics_->stage_index()->Set(-1);
    metrics_->theoretical_bubble()->Set(0);
  }
}

std::optional<v1::StageReport> StageServiceImpl::Report(
    int64_t results_since) const {
  std::shared_ptr<StageExecutor> executor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    executor = executor_;
  }
  if (executor == nullptr) return std::nullopt;
  v1::GetStatusResponse status = executor->GetStatus(results_since);
  v1::StageReport report;
  report.set_job_id(executor->config().job_id());
  report.set_stage(executor->config().stage());
  *report.mutable_status() = std::move(status);
  return report;
}

absl::StatusOr<std::shared_ptr<StageExecutor>> StageServiceImpl::Executor(
    const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
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

absl::Status StageServiceImpl::DoConfigure(const v1::StageConfig& config,
                                           v1::ConfigureResponse* response) {
  DropCurrent();
  ASSIGN_OR_RETURN(std::unique_ptr<StageExecutor> created,
                   StageExecutor::Create(config, backend_.get(), metrics_));
  std::shared_ptr<StageExecutor> executor = std::move(created);
  response->set_num_parameters(executor->num_parameters());
  for (int64_t d : executor->input_shape()) response->add_input_shape(d);
  for (int64_t d : executor->output_shape()) response->add_output_shape(d);
  response->set_steps_per_epoch(executor->steps_per_epoch());
  PT_LOG(INFO) << "configured stage " << config.stage() << "/"
               << config.num_stages() << " of job " << config.job_id()
               << ": layers [" << config.layer_begin() << ", "
               << config.layer_end() << "), " << executor->num_parameters()
               << " parameters on " << backend_->Describe();
  std::lock_guard<std::mutex> lock(mu_);
  executor_ = std::move(executor);
  return absl::OkStatus();
}

absl::Status StageServiceImpl::DoTrain(const v1::TrainRequest& request,
                                       v1::TrainResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<StageExecutor> executor,
                   Executor(request.job_id()));
  // Interleaved: the last stage too (its wrap-around link to stage 0).
  if (executor->needs_downstream()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (downstream_ == nullptr) {
      downstream_ =
          DownstreamStream::Open(executor->config().downstream(), executor,
                                 metrics_, options_.chunk_bytes);
      executor->SetDownstream(downstream_);
    }
  }
  ASSIGN_OR_RETURN(int64_t until, executor->Train(request.until_step()));
  response->set_until_step(until);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* StageServiceImpl::Configure(
    grpc::CallbackServerContext* context, const v1::ConfigureRequest* request,
    v1::ConfigureResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    reactor->Finish(ToGrpcStatus(DoConfigure(request->config(), response)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Train(
    grpc::CallbackServerContext* context, const v1::TrainRequest* request,
    v1::TrainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    reactor->Finish(ToGrpcStatus(DoTrain(*request, response)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Stop(
    grpc::CallbackServerContext* context, const v1::StopRequest* request,
    v1::StopResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request] {
    absl::Status status = Executor(request->job_id()).status();
    if (status.ok()) DropCurrent();
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetStatus(
    grpc::CallbackServerContext* context, const v1::GetStatusRequest* request,
    v1::GetStatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto executor = Executor(request->job_id());
  if (executor.ok()) {
    *response = (*executor)->GetStatus(request->results_since());
  }
  reactor->Finish(ToGrpcStatus(executor.status()));
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetWeights(
    grpc::CallbackServerContext* context, const v1::GetWeightsRequest* request,
    v1::GetWeightsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    auto executor = Executor(request->job_id());
    absl::Status status = executor.status();
    if (status.ok()) {
      auto weights = (*executor)->Weights();
      status = weights.status();
      if (status.ok()) *response = std::move(*weights);
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Profile(
    grpc::CallbackServerContext* context, const v1::ProfileRequest* request,
    v1::ProfileResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (executor_ != nullptr &&
          executor_->GetStatus(0).state() == v1::STAGE_STATE_RUNNING) {
        status = absl::FailedPreconditionError(
            "cannot profile while a stage is training");
      }
    }
    if (status.ok()) {
      auto profile = ProfileLayers(request->spec(), request->batch(),
                                   request->repetitions(), backend_.get());
      status = profile.status();
      if (status.ok()) *response = std::move(*profile);
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetTrace(
    grpc::CallbackServerContext* context, const v1::GetTraceRequest* request,
    v1::GetTraceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto executor = Executor(request->job_id());
  if (executor.ok()) *response = (*executor)->Trace(request->since_step());
  reactor->Finish(ToGrpcStatus(executor.status()));
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StageServiceImpl::Exchange(grpc::CallbackServerContext*) {
  return new UpstreamStream(this);
}

}  // namespace pipetrain
