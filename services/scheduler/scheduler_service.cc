#include "services/scheduler/scheduler_service.h"

#include <chrono>

#include "common/logging.h"
#include "common/secret.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/transport_security.h"

namespace pipetrain {
namespace {

std::string AuthorizationOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  return it == metadata.end()
             ? std::string()
             : std::string(it->second.data(), it->second.size());
}
// Writes a finished export in chunks, one write in flight; deletes itself
// when done.
class ExportWriter final
    : public grpc::ServerWriteReactor<v1::ExportModelChunk> {
 public:
  // Called once the export is built (or failed), off any reaction.
  void Start(absl::Status status, std::string bytes) {
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    bytes_ = std::move(bytes);
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the reader left"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  static constexpr size_t kChunkBytes = size_t{1} << 20;
  void WriteNext() {
    if (offset_ >= bytes_.size() && offset_ > 0) {
      Finish(grpc::Status::OK);
      return;
    }
    chunk_.set_data(bytes_.substr(offset_, kChunkBytes));
    offset_ += kChunkBytes;
    if (bytes_.empty()) offset_ = 1;  // an empty file is one empty chunk
    StartWrite(&chunk_);
  }
  std::string bytes_;
  size_t offset_ = 0;
  v1::ExportModelChunk chunk_;
};

}  // namespace

SchedulerServiceImpl::SchedulerServiceImpl(SchedulerCore* core,
                                           ControlCallMetrics* metrics,
                                           SchedulerAccess access)
    : core_(core), metrics_(metrics), access_(std::move(access)) {}

template <typename Resp>
grpc::ServerUnaryReactor* SchedulerServiceImpl::Serve(
    grpc::CallbackServerContext* context, Resp* response, const char* name,
    bool talks_to_workers, std::function<absl::StatusOr<Resp>()> call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status allowed =
      access_.api.Authorize(AuthorizationOf(*context), name);
  if (!allowed.ok()) {
    PT_LOG(WARNING) << name << " refused for " << context->peer() << ": "
                    << allowed.message();
    metrics_->Record(name, "grpc", 0, allowed);
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  auto run = [this, reactor, response, name, call = std::move(call)] {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Resp> result = call();
    if (result.ok()) *response = std::move(*result);
    metrics_->Record(
        name, "grpc",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        result.status());
    reactor->Finish(ToGrpcStatus(result.status()));
  };
  if (talks_to_workers) {
    slow_calls_.Post(std::move(run));
  } else {
    run();
  }
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerServiceImpl::RegisterWorker(
    grpc::CallbackServerContext* c, const v1::RegisterWorkerRequest* q,
    v1::RegisterWorkerResponse* r) {
  const PeerIdentity peer = PeerOf(*c);
  return Serve<v1::RegisterWorkerResponse>(
      c, r, "RegisterWorker", false,
      [this, q, peer]() -> absl::StatusOr<v1::RegisterWorkerResponse> {
        if (!access_.join_token.empty() &&
            !ConstantTimeEquals(access_.join_token, q->join_token())) {
          PT_LOG(WARNING) << "RegisterWorker refused for " << peer.address
                          << ": missing or wrong join token";
          return absl::UnauthenticatedError(
              "missing or wrong join token (--join_token_file)");
        }
        WorkerAdmission admission;
        admission.identity = peer.Primary();
        admission.identity_verified = peer.authenticated;
        admission.presented_secret = q->worker_secret();
        absl::StatusOr<std::string> secret = RandomSecret();
        if (!secret.ok()) return secret.status();
        admission.new_secret = *std::move(secret);
        return core_->RegisterWorker(*q, admission);
      });
}

grpc::ServerUnaryReactor* SchedulerServiceImpl::Heartbeat(
    grpc::CallbackServerContext* c, const v1::HeartbeatRequest* q,
    v1::HeartbeatResponse* r) {
  const std::string identity = PeerOf(*c).Primary();
  return Serve<v1::HeartbeatResponse>(
      c, r, "Heartbeat", false,
      [this, q, identity] { return core_->Heartbeat(*q, identity); });
}

#define PT_SERVE(Method, Req, Resp, slow)                        \
  grpc::ServerUnaryReactor* SchedulerServiceImpl::Method(        \
      grpc::CallbackServerContext* c, const Req* q, Resp* r) {   \
    return Serve<Resp>(c, r, #Method, slow,                      \
                       [this, q] { return core_->Method(*q); }); \
  }

PT_SERVE(SubmitJob, v1::SubmitJobRequest, v1::Job, false)
PT_SERVE(GetJob, v1::GetJobRequest, v1::Job, false)
PT_SERVE(ListJobs, v1::ListJobsRequest, v1::ListJobsResponse, false)
PT_SERVE(PauseJob, v1::JobActionRequest, v1::Job, true)
PT_SERVE(ResumeJob, v1::JobActionRequest, v1::Job, true)
PT_SERVE(CancelJob, v1::JobActionRequest, v1::Job, true)
PT_SERVE(ListWorkers, v1::ListWorkersRequest, v1::ListWorkersResponse, false)
PT_SERVE(GetPlan, v1::GetPlanRequest, v1::Plan, false)
PT_SERVE(GetVersions, v1::GetVersionsRequest, v1::GetVersionsResponse, true)
PT_SERVE(Evaluate, v1::EvaluateRequest, v1::EvalResult, true)
PT_SERVE(GetJobTrace, v1::GetJobTraceRequest, v1::GetJobTraceResponse, true)
PT_SERVE(ListCheckpoints, v1::ListCheckpointsRequest,
         v1::ListCheckpointsResponse, true)
PT_SERVE(CheckpointJob, v1::CheckpointJobRequest, v1::CheckpointJobResponse,
         true)
PT_SERVE(RemoveWorker, v1::RemoveWorkerRequest, v1::RemoveWorkerResponse, false)

#undef PT_SERVE

grpc::ServerWriteReactor<v1::ExportModelChunk>*
SchedulerServiceImpl::ExportModel(grpc::CallbackServerContext* context,
                                  const v1::ExportModelRequest* q) {
  auto* writer = new ExportWriter();
  const absl::Status allowed =
      access_.api.Authorize(AuthorizationOf(*context), "ExportModel");
  if (!allowed.ok()) {
    PT_LOG(WARNING) << "ExportModel refused for " << context->peer() << ": "
                    << allowed.message();
    metrics_->Record("ExportModel", "grpc", 0, allowed);
    writer->Start(allowed, "");
    return writer;
  }
  // Loading a checkpoint reads files: not in a reaction.
  slow_calls_.Post([this, writer, q] {
    const auto start = std::chrono::steady_clock::now();
    std::string bytes;
    const absl::Status status =
        core_->ExportModel(*q, [&bytes](absl::string_view piece) {
          bytes.append(piece.data(), piece.size());
          return absl::OkStatus();
        });
    metrics_->Record(
        "ExportModel", "grpc",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        status);
    writer->Start(status, std::move(bytes));
  });
  return writer;
}

}  // namespace pipetrain
