#include "services/ctl/scheduler_client.h"

#include <algorithm>

#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {
namespace ctl {
namespace {

v1::JobActionRequest Action(const std::string& job_id) {
  v1::JobActionRequest request;
  request.set_job_id(job_id);
  return request;
}

}  // namespace

SchedulerClient::SchedulerClient(const std::string& target,
                                 double timeout_seconds, std::string token)
    : target_(target),
      timeout_seconds_(timeout_seconds),
      channel_(CreatePipetrainChannel(target)),
      stub_(v1::SchedulerService::NewStub(channel_)),
      token_(std::move(token)) {}

bool SchedulerClient::Connected() const {
  return channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
}

template <typename Response>
absl::StatusOr<Response> SchedulerClient::Call(const Rpc<Response>& rpc,
                                               double seconds) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(seconds));
  if (!token_.empty()) context.AddMetadata("authorization", "Bearer " + token_);
  Response response;
  const absl::Status status = FromGrpcStatus(rpc(&context, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> SchedulerClient::SubmitJob(const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  return Call<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) {
        return stub_->SubmitJob(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::Job> SchedulerClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Call<v1::Job>([&](grpc::ClientContext* c,
                           v1::Job* r) { return stub_->GetJob(c, request, r); },
                       timeout_seconds_);
}

absl::StatusOr<v1::ListJobsResponse> SchedulerClient::ListJobs() {
  const v1::ListJobsRequest request;
  return Call<v1::ListJobsResponse>(
      [&](grpc::ClientContext* c, v1::ListJobsResponse* r) {
        return stub_->ListJobs(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::Job> SchedulerClient::PauseJob(const std::string& job_id) {
  const v1::JobActionRequest request = Action(job_id);
  return Call<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) {
        return stub_->PauseJob(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::Job> SchedulerClient::ResumeJob(const std::string& job_id) {
  const v1::JobActionRequest request = Action(job_id);
  return Call<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) {
        return stub_->ResumeJob(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::Job> SchedulerClient::CancelJob(const std::string& job_id) {
  const v1::JobActionRequest request = Action(job_id);
  return Call<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) {
        return stub_->CancelJob(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::ListWorkersResponse> SchedulerClient::ListWorkers() {
  const v1::ListWorkersRequest request;
  return Call<v1::ListWorkersResponse>(
      [&](grpc::ClientContext* c, v1::ListWorkersResponse* r) {
        return stub_->ListWorkers(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::Plan> SchedulerClient::GetPlan(const std::string& job_id) {
  v1::GetPlanRequest request;
  request.set_job_id(job_id);
  return Call<v1::Plan>(
      [&](grpc::ClientContext* c, v1::Plan* r) {
        return stub_->GetPlan(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::GetVersionsResponse> SchedulerClient::GetVersions(
    const std::string& job_id, int64_t since_step) {
  v1::GetVersionsRequest request;
  request.set_job_id(job_id);
  request.set_since_step(since_step);
  return Call<v1::GetVersionsResponse>(
      [&](grpc::ClientContext* c, v1::GetVersionsResponse* r) {
        return stub_->GetVersions(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::EvalResult> SchedulerClient::Evaluate(
    const std::string& job_id, int64_t max_samples) {
  v1::EvaluateRequest request;
  request.set_job_id(job_id);
  request.set_max_samples(max_samples);
  return Call<v1::EvalResult>(
      [&](grpc::ClientContext* c, v1::EvalResult* r) {
        return stub_->Evaluate(c, request, r);
      },
      std::max(timeout_seconds_, kEvaluateMinSeconds));
}

absl::StatusOr<v1::GetJobTraceResponse> SchedulerClient::GetJobTrace(
    const std::string& job_id, int64_t last_steps) {
  v1::GetJobTraceRequest request;
  request.set_job_id(job_id);
  request.set_last_steps(last_steps);
  return Call<v1::GetJobTraceResponse>(
      [&](grpc::ClientContext* c, v1::GetJobTraceResponse* r) {
        return stub_->GetJobTrace(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::ListCheckpointsResponse> SchedulerClient::ListCheckpoints(
    const std::string& job_id) {
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  return Call<v1::ListCheckpointsResponse>(
      [&](grpc::ClientContext* c, v1::ListCheckpointsResponse* r) {
        return stub_->ListCheckpoints(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::CheckpointJobResponse> SchedulerClient::CheckpointJob(
    const std::string& job_id) {
  v1::CheckpointJobRequest request;
  request.set_job_id(job_id);
  return Call<v1::CheckpointJobResponse>(
      [&](grpc::ClientContext* c, v1::CheckpointJobResponse* r) {
        return stub_->CheckpointJob(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<v1::RemoveWorkerResponse> SchedulerClient::RemoveWorker(
    const std::string& worker_id) {
  v1::RemoveWorkerRequest request;
  request.set_worker_id(worker_id);
  return Call<v1::RemoveWorkerResponse>(
      [&](grpc::ClientContext* c, v1::RemoveWorkerResponse* r) {
        return stub_->RemoveWorker(c, request, r);
      },
      timeout_seconds_);
}

absl::StatusOr<std::string> SchedulerClient::ExportModel(
    const std::string& job_id, int64_t version) {
  v1::ExportModelRequest request;
  request.set_job_id(job_id);
  request.set_version(version);
  grpc::ClientContext ctx;
  // A large model on a slow link: the export's deadline is generous.
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(600));
  std::unique_ptr<grpc::ClientReader<v1::ExportModelChunk>> reader =
      stub_->ExportModel(&ctx, request);
  std::string out;
  v1::ExportModelChunk chunk;
  while (reader->Read(&chunk)) out += chunk.data();
  RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  return out;
}

}  // namespace ctl
}  // namespace pipetrain
