#include "services/scheduler/grpc_stage_control.h"

#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {
namespace {

// Runs one unary call with a deadline and converts its status.
template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Call(v1::StageService::Stub* stub, Method method,
                              const Request& request, double deadline_s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(deadline_s));
  Response response;
  RETURN_IF_ERROR(FromGrpcStatus((stub->*method)(&ctx, request, &response)));
  return response;
}

}  // namespace

v1::StageService::Stub* GrpcStageControl::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::StageService::NewStub(CreatePipetrainChannel(address));
  }
  return stub.get();
}

absl::StatusOr<v1::ProfileResponse> GrpcStageControl::Profile(
    const std::string& address, const v1::ProfileRequest& request) {
  return Call<v1::ProfileRequest, v1::ProfileResponse>(
      StubFor(address), &v1::StageService::Stub::Profile, request, 300);
}

absl::StatusOr<v1::ConfigureResponse> GrpcStageControl::Configure(
    const std::string& address, const v1::StageConfig& config) {
  v1::ConfigureRequest request;
  *request.mutable_config() = config;
  return Call<v1::ConfigureRequest, v1::ConfigureResponse>(
      StubFor(address), &v1::StageService::Stub::Configure, request, 120);
}

absl::StatusOr<int64_t> GrpcStageControl::Train(const std::string& address,
                                                const std::string& job_id,
                                                int64_t until_step) {
  v1::TrainRequest request;
  request.set_job_id(job_id);
  request.set_until_step(until_step);
  ASSIGN_OR_RETURN(
      v1::TrainResponse r,
      (Call<v1::TrainRequest, v1::TrainResponse>(
          StubFor(address), &v1::StageService::Stub::Train, request, 30)));
  return r.until_step();
}

absl::Status GrpcStageControl::Stop(const std::string& address,
                                    const std::string& job_id) {
  v1::StopRequest request;
  request.set_job_id(job_id);
  return Call<v1::StopRequest, v1::StopResponse>(
             StubFor(address), &v1::StageService::Stub::Stop, request, 30)
      .status();
}

absl::StatusOr<v1::EvalResult> GrpcStageControl::Evaluate(
    const std::string& address, const std::string& job_id,
    int64_t max_samples) {
  v1::EvaluateStageRequest request;
  request.set_job_id(job_id);
  request.set_max_samples(max_samples);
  // A pass over a whole held-out split on a slow device takes minutes.
  constexpr double kEvaluateDeadlineSeconds = 600;
  ASSIGN_OR_RETURN(v1::EvaluateStageResponse r,
                   (Call<v1::EvaluateStageRequest, v1::EvaluateStageResponse>(
                       StubFor(address), &v1::StageService::Stub::Evaluate,
                       request, kEvaluateDeadlineSeconds)));
  return r.result();
}

absl::StatusOr<v1::GetTraceResponse> GrpcStageControl::GetTrace(
    const std::string& address, const std::string& job_id, int64_t since_step) {
  v1::GetTraceRequest request;
  request.set_job_id(job_id);
  request.set_since_step(since_step);
  return Call<v1::GetTraceRequest, v1::GetTraceResponse>(
      StubFor(address), &v1::StageService::Stub::GetTrace, request, 30);
}

}  // namespace pipetrain
