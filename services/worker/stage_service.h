// The stage worker's gRPC service: control calls (Configure, Train, Stop,
// GetStatus, GetWeights, Profile, GetTrace, Evaluate), link probes (Probe,
// and ProbeExchange on the stage stream's path),
// the checkpoint calls
// (Snapshot, FetchSnapshot, RestoreState) and the Exchange stream between
// neighbouring stages, on the callback API.
//
// The service is a thin adapter over a StageHost, which owns the backend and
// the current stage: each call becomes one host call, its status converted
// once (services/rpc/grpc_util.h). Exchange streams are created by the
// ExchangeAcceptor the worker wires in (stage_streams.h), so this file and
// the streams depend on the host, not on each other.
//
// Thread-safe. Calls that block (configuring, stopping, copying weights,
// profiling, taking a snapshot, loading a restored state) run on the
// service's control thread, evaluations on a thread of
// their own so a long one never holds up Stop; none runs in a gRPC reaction.
#ifndef PIPETRAIN_SERVICES_WORKER_STAGE_SERVICE_H_
#define PIPETRAIN_SERVICES_WORKER_STAGE_SERVICE_H_

#include <functional>

#include "pipetrain/v1/stage.grpc.pb.h"
#include "services/rpc/control_queue.h"
#include "services/worker/stage_access.h"
#include "worker/pipeline/stage_host.h"

namespace pipetrain {

// The most bytes a Probe may carry in either direction (its payload, and
// the reply it asks for): enough to time a call of ~100 ms on a 1 Gb/s
// link, small enough that probes cannot exhaust a worker's memory.
inline constexpr int64_t kMaxProbeBytes = 16 << 20;

// Creates the reactor of one incoming Exchange stream (its upstream end)
// for the call `context` (its peer names the stream in logs), or of a
// ProbeExchange stream when `probe`; gRPC owns it once returned. Never
// null.
using ExchangeAcceptor =
    std::function<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*(
        grpc::CallbackServerContext* context, bool probe)>;

// Every method on the callback API, Exchange and ProbeExchange as raw
// (ByteBuffer) streams.
using StageServiceBase = v1::StageService::WithCallbackMethod_Configure<
    v1::StageService::WithCallbackMethod_Train<v1::StageService::WithCallbackMethod_Stop<
        v1::StageService::WithCallbackMethod_GetStatus<
            v1::StageService::WithCallbackMethod_GetWeights<
                v1::StageService::WithCallbackMethod_Profile<
                    v1::StageService::WithCallbackMethod_GetTrace<
                        v1::StageService::WithCallbackMethod_Evaluate<
                            v1::StageService::WithCallbackMethod_Snapshot<
                                v1::StageService::WithCallbackMethod_FetchSnapshot<
                                    v1::StageService::WithCallbackMethod_RestoreState<
                                        v1::StageService::WithRawCallbackMethod_Exchange<
                                            v1::StageService::WithCallbackMethod_Probe<
                                                v1::StageService::
                                                    WithRawCallbackMethod_ProbeExchange<
                                                        v1::StageService::
                                                            Service>>>>>>>>>>>>>>;

class StageServiceImpl final : public StageServiceBase {
 public:
  // `host` is borrowed and must outlive the service. Every call passes
  // `access` (stage_access.h) first.
  StageServiceImpl(StageHost* host, ExchangeAcceptor accept_exchange,
                   StageAccess access = {});

  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* context,
                                      const v1::ConfigureRequest* request,
                                      v1::ConfigureResponse* response) override;
  grpc::ServerUnaryReactor* Train(grpc::CallbackServerContext* context,
                                  const v1::TrainRequest* request,
                                  v1::TrainResponse* response) override;
  grpc::ServerUnaryReactor* Stop(grpc::CallbackServerContext* context,
                                 const v1::StopRequest* request,
                                 v1::StopResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* GetWeights(
      grpc::CallbackServerContext* context,
      const v1::GetWeightsRequest* request,
      v1::GetWeightsResponse* response) override;
  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* context,
                                    const v1::ProfileRequest* request,
                                    v1::ProfileResponse* response) override;
  // The current stage's pipeline trace from request->since_step on;
  // answered inline (a copy of a bounded window).
  grpc::ServerUnaryReactor* GetTrace(grpc::CallbackServerContext* context,
                                     const v1::GetTraceRequest* request,
                                     v1::GetTraceResponse* response) override;
  grpc::ServerUnaryReactor* Evaluate(
      grpc::CallbackServerContext* context,
      const v1::EvaluateStageRequest* request,
      v1::EvaluateStageResponse* response) override;
  // Checkpoints: see StageHost. Snapshot asks for one; FetchSnapshot
  // streams a held one as StateChunks of at most kStateChunkBytes data;
  // RestoreState reassembles the client's chunks (each checked as it comes:
  // a malformed stream ends at once with INVALID_ARGUMENT and changes
  // nothing) and loads them when the stream ends. A stream without chunks
  // names no job: it restores the worker's current stage, which accepts it
  // only when it has no parameters.
  grpc::ServerUnaryReactor* Snapshot(grpc::CallbackServerContext* context,
                                     const v1::SnapshotRequest* request,
                                     v1::SnapshotResponse* response) override;
  grpc::ServerWriteReactor<v1::StateChunk>* FetchSnapshot(
      grpc::CallbackServerContext* context,
      const v1::FetchSnapshotRequest* request) override;
  grpc::ServerReadReactor<v1::StateChunk>* RestoreState(
      grpc::CallbackServerContext* context,
      v1::RestoreStateResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ProbeExchange(
      grpc::CallbackServerContext* context) override;
  // Link probe: answered inline with the payload's size and reply_bytes
  // zero bytes; INVALID_ARGUMENT past kMaxProbeBytes either way.
  grpc::ServerUnaryReactor* Probe(grpc::CallbackServerContext* context,
                                  const v1::ProbeRequest* request,
                                  v1::ProbeResponse* response) override;

 private:
  // Finishes `reactor` with `result`'s status, moving its value into
  // `response` on success.
  template <typename T>
  static void Answer(grpc::ServerUnaryReactor* reactor,
                     absl::StatusOr<T> result, T* response);
  // Whether the caller may call `method` (stage_access.h); every handler
  // asks first. Streaming handlers answer a refusal with a RefusedCall
  // (services/rpc/refused_call.h).
  absl::Status Admit(grpc::CallbackServerContext* context,
                     const char* method) const;
  // The unary call's reactor, already finished with PERMISSION_DENIED when
  // the caller may not call `method`; null when it may.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context,
                                   const char* method) const;
  // An Exchange or ProbeExchange stream: refused, or the acceptor's.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AcceptStream(
      grpc::CallbackServerContext* context, const char* method, bool probe);

  // Constant after construction.
  StageHost* const host_;  // borrowed
  const ExchangeAcceptor accept_exchange_;
  const StageAccess access_;
  // Run the blocking calls; they finish what is queued when destroyed.
  ControlQueue control_;
  ControlQueue evaluations_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_STAGE_SERVICE_H_
