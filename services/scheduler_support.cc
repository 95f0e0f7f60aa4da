#include "services/scheduler_support.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/grpc_util.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"
#include "worker/pipeline/schedule.h"
#include "worker/pipeline/training_spec.h"

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
  std::lock_guard<std::mutex> lock(mu_);
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

absl::StatusOr<v1::GetWeightsResponse> GrpcStageControl::GetWeights(
    const std::string& address, const std::string& job_id) {
  v1::GetWeightsRequest request;
  request.set_job_id(job_id);
  return Call<v1::GetWeightsRequest, v1::GetWeightsResponse>(
      StubFor(address), &v1::StageService::Stub::GetWeights, request, 120);
}

absl::StatusOr<v1::GetTraceResponse> GrpcStageControl::GetTrace(
    const std::string& address, const std::string& job_id, int64_t since_step) {
  v1::GetTraceRequest request;
  request.set_job_id(job_id);
  request.set_since_step(since_step);
  return Call<v1::GetTraceRequest, v1::GetTraceResponse>(
      StubFor(address), &v1::StageService::Stub::GetTrace, request, 30);
}

absl::Status CpuModelSupport::Validate(const v1::TrainingSpec& spec) {
  return ValidateTrainingSpec(spec);
}

double CpuModelSupport::TheoreticalBubble(const v1::JobSpec& spec,
                                          int num_stages) {
  ScheduleParams params;
  switch (spec.schedule()) {
    case v1::SCHEDULE_1F1B_FLUSH:
      params.kind = ScheduleKind::kOneFOneBFlush;
      break;
    case v1::SCHEDULE_INTERLEAVED:
      params.kind = ScheduleKind::kInterleaved;
      params.virtual_stages = std::max(2, spec.virtual_stages());
      break;
    case v1::SCHEDULE_ZB_H1:
      params.kind = ScheduleKind::kZeroBubbleH1;
      break;
    case v1::SCHEDULE_ASYNC_1F1B:
      params.kind = ScheduleKind::kOneFOneBAsync;
      break;
    case v1::SCHEDULE_2BW:
      params.kind = ScheduleKind::kTwoBW;
      break;
    default:
      params.kind = ScheduleKind::kGPipe;
  }
  params.num_stages = std::max(1, num_stages);
  params.micro_batches =
      static_cast<int>(std::max<int64_t>(1, spec.training().micro_batches()));
  return pipetrain::TheoreticalBubble(params, SimCosts());
}

absl::StatusOr<v1::EvalResult> CpuModelSupport::Evaluate(
    const v1::TrainingSpec& spec, const std::vector<v1::TensorProto>& weights,
    int64_t max_samples) {
  std::lock_guard<std::mutex> lock(mu_);
  auto backend = CreateCpuBackend(0);
  ASSIGN_OR_RETURN(std::unique_ptr<LocalTrainer> trainer,
                   LocalTrainer::Create(spec, backend.get()));
  std::vector<Tensor> host;
  for (const v1::TensorProto& t : weights) {
    const Shape shape(t.shape().begin(), t.shape().end());
    if (t.dtype() != v1::DTYPE_F32 ||
        t.data().size() != NumElements(shape) * sizeof(float)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights of ", t.name(), " are not float32 of shape ",
                       ShapeToString(shape)));
    }
    Tensor tensor = Tensor::Host(shape);
    std::copy(t.data().begin(), t.data().end(),
              static_cast<char*>(tensor.raw()));
    host.push_back(tensor);
  }
  RETURN_IF_ERROR(trainer->model()->LoadParams(host));
  ASSIGN_OR_RETURN(EvalReport report, trainer->Evaluate(max_samples));
  v1::EvalResult out;
  out.set_loss(report.loss);
  out.set_accuracy(report.accuracy);
  out.set_samples(report.samples);
  return out;
}

}  // namespace pipetrain
