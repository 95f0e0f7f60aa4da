#include "services/worker/stage_service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/refused_call.h"

namespace pipetrain {
namespace {

// Streams one snapshot, one chunk in flight; deletes itself when done.
// Successive write reactions run on different gRPC threads, ordered inside
// libgrpc; the lock states that order where ThreadSanitizer sees it.
class SnapshotWriter final : public grpc::ServerWriteReactor<v1::StateChunk> {
 public:
  // Starts streaming `snapshot`, or finishes with its lookup's error.
  SnapshotWriter(
      const std::string& job_id,
      absl::StatusOr<std::shared_ptr<const StageStateSnapshot>> snapshot) {
    if (!snapshot.ok()) {
      Finish(ToGrpcStatus(snapshot.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    chunker_.emplace(job_id, *std::move(snapshot));
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away"));
      return;
    }
    absl::MutexLock lock(&mu_);
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (chunker_->Next(&chunk_)) {
      StartWrite(&chunk_);
    } else {
      Finish(grpc::Status::OK);
    }
  }
  absl::Mutex mu_;
  std::optional<StateChunker> chunker_ ABSL_GUARDED_BY(mu_);
  v1::StateChunk chunk_ ABSL_GUARDED_BY(mu_);
};

// Reads a RestoreState stream, checking each chunk as it comes, and loads
// the state on the control thread once the client has sent everything;
// deletes itself when done.
class RestoreReader final : public grpc::ServerReadReactor<v1::StateChunk> {
 public:
  RestoreReader(StageHost* host, ControlQueue* control,
                grpc::CallbackServerContext* context,
                v1::RestoreStateResponse* response)
      : host_(host), control_(control), context_(context), response_(response) {
    StartRead(&chunk_);
  }
  void OnReadDone(bool ok) override {
    // gRPC runs one read reaction at a time, but successive ones on
    // different threads, ordered inside libgrpc where ThreadSanitizer
    // cannot see; the lock (uncontended: one per chunk) states that order.
    absl::MutexLock lock(&mu_);
    if (!ok) {
      EndOfStream();
      return;
    }
    const absl::Status status = Absorb();
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&chunk_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Absorb() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (assembler_ == nullptr) {
      ASSIGN_OR_RETURN(assembler_, host_->StartRestore(chunk_.job_id()));
    }
    return assembler_->Add(chunk_);
  }
  void EndOfStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (context_->IsCancelled()) {
      // Cut off, not ended by the client: load nothing.
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cut"));
      return;
    }
    control_->Post([this] {
      grpc::Status status;
      {
        absl::MutexLock lock(&mu_);
        absl::StatusOr<v1::RestoreStateResponse> result = Load();
        if (result.ok()) *response_ = *std::move(result);
        status = ToGrpcStatus(result.status());
      }
      // Last: once finished, gRPC may delete this reactor (OnDone).
      Finish(status);
    });
  }
  absl::StatusOr<v1::RestoreStateResponse> Load()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (assembler_ == nullptr) return host_->RestoreState("", TrainingState());
    ASSIGN_OR_RETURN(TrainingState state, assembler_->Finish());
    return host_->RestoreState(assembler_->job_id(), state);
  }

  StageHost* const host_;                       // borrowed
  ControlQueue* const control_;                 // borrowed
  grpc::CallbackServerContext* const context_;  // owned by gRPC
  v1::RestoreStateResponse* const response_;    // owned by gRPC
  absl::Mutex mu_;
  // Filled by gRPC between read reactions (outside mu_: gRPC's read).
  v1::StateChunk chunk_;
  std::unique_ptr<StateAssembler> assembler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

StageServiceImpl::StageServiceImpl(StageHost* host,
                                   ExchangeAcceptor accept_exchange,
                                   StageAccess access)
    : host_(host),
      accept_exchange_(std::move(accept_exchange)),
      access_(std::move(access)) {}

absl::Status StageServiceImpl::Admit(grpc::CallbackServerContext* context,
                                     const char* method) const {
  const absl::Status allowed =
      access_.Check(PeerOf(*context), method, host_->UpstreamIdentity());
  if (!allowed.ok()) PT_LOG(WARNING) << allowed.message();
  return allowed;
}

grpc::ServerUnaryReactor* StageServiceImpl::Refuse(
    grpc::CallbackServerContext* context, const char* method) const {
  const absl::Status allowed = Admit(context, method);
  if (allowed.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(allowed));
  return reactor;
}

template <typename T>
void StageServiceImpl::Answer(grpc::ServerUnaryReactor* reactor,
                              absl::StatusOr<T> result, T* response) {
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
}

grpc::ServerUnaryReactor* StageServiceImpl::Configure(
    grpc::CallbackServerContext* context, const v1::ConfigureRequest* request,
    v1::ConfigureResponse* response) {
  if (auto* refused = Refuse(context, "Configure")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Configure(request->config()), response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Train(
    grpc::CallbackServerContext* context, const v1::TrainRequest* request,
    v1::TrainResponse* response) {
  if (auto* refused = Refuse(context, "Train")) return refused;
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
  if (auto* refused = Refuse(context, "Stop")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request] {
    reactor->Finish(ToGrpcStatus(host_->Stop(request->job_id())));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetStatus(
    grpc::CallbackServerContext* context, const v1::GetStatusRequest* request,
    v1::GetStatusResponse* response) {
  if (auto* refused = Refuse(context, "GetStatus")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Answer(reactor, host_->Status(request->job_id(), request->results_since()),
         response);
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetWeights(
    grpc::CallbackServerContext* context, const v1::GetWeightsRequest* request,
    v1::GetWeightsResponse* response) {
  if (auto* refused = Refuse(context, "GetWeights")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Weights(request->job_id()), response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Profile(
    grpc::CallbackServerContext* context, const v1::ProfileRequest* request,
    v1::ProfileResponse* response) {
  if (auto* refused = Refuse(context, "Profile")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Profile(*request), response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::GetTrace(
    grpc::CallbackServerContext* context, const v1::GetTraceRequest* request,
    v1::GetTraceResponse* response) {
  if (auto* refused = Refuse(context, "GetTrace")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Answer(reactor, host_->Trace(request->job_id(), request->since_step()),
         response);
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Evaluate(
    grpc::CallbackServerContext* context,
    const v1::EvaluateStageRequest* request,
    v1::EvaluateStageResponse* response) {
  if (auto* refused = Refuse(context, "Evaluate")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  evaluations_.Post([this, reactor, request, response] {
    Answer(reactor, host_->Evaluate(request->job_id(), request->max_samples()),
           response);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StageServiceImpl::Snapshot(
    grpc::CallbackServerContext* context, const v1::SnapshotRequest* request,
    v1::SnapshotResponse* response) {
  if (auto* refused = Refuse(context, "Snapshot")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_.Post([this, reactor, request, response] {
    absl::StatusOr<int64_t> step =
        host_->Snapshot(request->job_id(), request->step());
    if (step.ok()) response->set_step(*step);
    reactor->Finish(ToGrpcStatus(step.status()));
  });
  return reactor;
}

grpc::ServerWriteReactor<v1::StateChunk>* StageServiceImpl::FetchSnapshot(
    grpc::CallbackServerContext* context,
    const v1::FetchSnapshotRequest* request) {
  const absl::Status allowed = Admit(context, "FetchSnapshot");
  if (!allowed.ok()) {
    return new RefusedCall<grpc::ServerWriteReactor<v1::StateChunk>>(
        ToGrpcStatus(allowed));
  }
  return new SnapshotWriter(
      request->job_id(),
      host_->FetchSnapshot(request->job_id(), request->step()));
}

grpc::ServerReadReactor<v1::StateChunk>* StageServiceImpl::RestoreState(
    grpc::CallbackServerContext* context, v1::RestoreStateResponse* response) {
  const absl::Status allowed = Admit(context, "RestoreState");
  if (!allowed.ok()) {
    return new RefusedCall<grpc::ServerReadReactor<v1::StateChunk>>(
        ToGrpcStatus(allowed));
  }
  return new RestoreReader(host_, &control_, context, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StageServiceImpl::AcceptStream(grpc::CallbackServerContext* context,
                               const char* method, bool probe) {
  const absl::Status allowed = Admit(context, method);
  if (!allowed.ok()) {
    return new RefusedCall<
        grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(
        ToGrpcStatus(allowed));
  }
  return accept_exchange_(context, probe);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StageServiceImpl::Exchange(grpc::CallbackServerContext* context) {
  return AcceptStream(context, "Exchange", /*probe=*/false);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StageServiceImpl::ProbeExchange(grpc::CallbackServerContext* context) {
  return AcceptStream(context, "ProbeExchange", /*probe=*/true);
}

grpc::ServerUnaryReactor* StageServiceImpl::Probe(
    grpc::CallbackServerContext* context, const v1::ProbeRequest* request,
    v1::ProbeResponse* response) {
  if (auto* refused = Refuse(context, "Probe")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const int64_t received = static_cast<int64_t>(request->payload().size());
  if (received > kMaxProbeBytes || request->reply_bytes() < 0 ||
      request->reply_bytes() > kMaxProbeBytes) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("Probe: payload (", received, " bytes) and reply_bytes (",
                     request->reply_bytes(), ") must be within [0, ",
                     kMaxProbeBytes, "]")));
    return reactor;
  }
  response->set_received_bytes(received);
  response->mutable_payload()->assign(
      static_cast<size_t>(request->reply_bytes()), '\0');
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pipetrain
