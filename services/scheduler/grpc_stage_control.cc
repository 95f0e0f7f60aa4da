#include "services/scheduler/grpc_stage_control.h"

#include "common/status_macros.h"
#include "scheduler/state_chunks.h"
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

// A state transfer's deadline: a minute, plus a second per 50 MiB (a slow
// link to an edge node still moves a large stage).
double TransferDeadlineSeconds(int64_t bytes) {
  return 60.0 + static_cast<double>(bytes) / (50 << 20);
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

absl::StatusOr<int64_t> GrpcStageControl::Snapshot(const std::string& address,
                                                   const std::string& job_id,
                                                   int64_t step) {
  v1::SnapshotRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  ASSIGN_OR_RETURN(
      v1::SnapshotResponse r,
      (Call<v1::SnapshotRequest, v1::SnapshotResponse>(
          StubFor(address), &v1::StageService::Stub::Snapshot, request, 30)));
  return r.step();
}

absl::Status GrpcStageControl::FetchSnapshot(const std::string& address,
                                             const std::string& job_id,
                                             int64_t step,
                                             const StageStateSink& sink) {
  v1::FetchSnapshotRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  grpc::ClientContext ctx;
  // The size is unknown up front: allow for a large stage on a slow link.
  constexpr double kFetchDeadlineSeconds = 600;
  ctx.set_deadline(DeadlineIn(kFetchDeadlineSeconds));
  std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader =
      StubFor(address)->FetchSnapshot(&ctx, request);
  StateChunkAssembler assembler(sink);
  v1::StateChunk chunk;
  absl::Status failed;
  while (failed.ok() && reader->Read(&chunk)) failed = assembler.Add(chunk);
  if (!failed.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();  // ends the cancelled call; its status is moot
    return failed;
  }
  RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  return assembler.Finish();
}

absl::StatusOr<int64_t> GrpcStageControl::RestoreState(
    const std::string& address, const std::string& job_id,
    const StageStateInfo& info, const std::vector<StateTensor>& tensors) {
  int64_t bytes = 0;
  for (const StateTensor& t : tensors) bytes += t.data.size();
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(TransferDeadlineSeconds(bytes)));
  v1::RestoreStateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::StateChunk>> writer =
      StubFor(address)->RestoreState(&ctx, &response);
  // Chunks are cut one tensor at a time, so at most one tensor is copied.
  for (const StateTensor& t : tensors) {
    bool open = true;
    for (const v1::StateChunk& c : ChunksOf(job_id, info, t)) {
      if (!(open = writer->Write(c))) break;
    }
    if (!open) break;  // the stage ended the call: Finish says why
  }
  writer->WritesDone();
  RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return response.tensors();
}

}  // namespace pipetrain
