#include "services/worker/stage_service.h"

#include <utility>

#include "services/rpc/grpc_util.h"

namespace pipetrain {

StageServiceImpl::StageServiceImpl(StageHost* host,
                                   ExchangeAcceptor accept_exchange)
    : host_(host), accept_exchange_(std::move(accept_exchange)) {}

template <typename T>
void StageServiceImpl::Answer(grpc::ServerUnaryReactor* reactor,
                              absl::StatusOr<T> result, T* response) {
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
}

grpc::ServerUnaryReactor* StageServiceImpl::Configure(
    grpc::CallbackServerContext* context, const v1::ConfigureRequest* request,
    v1::ConfigureResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Configure(request->config()), response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Train(
    grpc::CallbackServerContext* context, const v1::TrainRequest* request,
    v1::TrainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    absl::StatusOr<int64_t> until =
        host_->Train(request->job_id(), request->until_step());
    if (until.ok()) response->set_until_step(*until);
    reactor->Finish(ToGrpcStatus(until.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Stop(
    grpc::CallbackServerContext* context, const v1::StopRequest* request,
    v1::StopResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request] {
    reactor->Finish(ToGrpcStatus(host_->Stop(request->job_id())));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetStatus(
    grpc::CallbackServerContext* context, const v1::GetStatusRequest* request,
    v1::GetStatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Answer(reactor, host_->Status(request->job_id(), request->results_since()),
         response);
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetWeights(
    grpc::CallbackServerContext* context, const v1::GetWeightsRequest* request,
    v1::GetWeightsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Weights(request->job_id()), response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Profile(
    grpc::CallbackServerContext* context, const v1::ProfileRequest* request,
    v1::ProfileResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Profile(*request), response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetTrace(
    grpc::CallbackServerContext* context, const v1::GetTraceRequest* request,
    v1::GetTraceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Answer(reactor, host_->Trace(request->job_id(), request->since_step()),
         response);
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Evaluate(
    grpc::CallbackServerContext* context,
    const v1::EvaluateStageRequest* request,
    v1::EvaluateStageResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  evaluations_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Evaluate(request->job_id(), request->max_samples()),
           response);
  });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StageServiceImpl::Exchange(grpc::CallbackServerContext*) {
  return accept_exchange_();
}

}  // namespace pipetrain
