// The stage worker's gRPC service: control calls (Configure, Train, Stop,
// GetStatus, GetWeights, Profile, GetTrace) and the Exchange stream between
// neighbouring stages, on the callback API.
//
// A worker hosts one stage at a time; Configure replaces it. The service
// owns the worker's backend, the current StageExecutor and the stream to
// the downstream neighbour; the upstream neighbour's stream arrives through
// Exchange. Frames are decoded and validated here, before anything reaches
// the executor, so bad input ends only the stream that carried it.
//
// Thread-safe. Slow control work (building a model, profiling) runs on the
// service's own control thread, never in a gRPC reaction.
#ifndef PIPETRAIN_SERVICES_WORKER_STAGE_SERVICE_H_
#define PIPETRAIN_SERVICES_WORKER_STAGE_SERVICE_H_

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "services/rpc/control_queue.h"
#include "worker/compute/backend.h"
#include "worker/pipeline/stage_executor.h"
#include "worker/pipeline/stage_metrics.h"

namespace pipetrain {

class DownstreamStream;

struct StageServiceOptions {
  // Payload bytes per frame on the Exchange stream.
  size_t chunk_bytes = 1 << 20;
};

// Every method on the callback API, Exchange as a raw (ByteBuffer) stream.
using StageServiceBase = v1::StageService::WithCallbackMethod_Configure<
    v1::StageService::WithCallbackMethod_Train<
        v1::StageService::WithCallbackMethod_Stop<
            v1::StageService::WithCallbackMethod_GetStatus<
                v1::StageService::WithCallbackMethod_GetWeights<
                    v1::StageService::WithCallbackMethod_Profile<
                        v1::StageService::WithCallbackMethod_GetTrace<
                            v1::StageService::WithRawCallbackMethod_Exchange<
                                v1::StageService::Service>>>>>>>>;

class StageServiceImpl final : public StageServiceBase {
 public:
  // `backend` is owned by the service; `metrics` (borrowed, may be null)
  // receives the stage's metrics.
  StageServiceImpl(std::unique_ptr<Backend> backend, StageMetrics* metrics,
                   StageServiceOptions options = {});
  ~StageServiceImpl() override;

  // Stops the current stage and closes its streams (before server shutdown).
  void Shutdown();

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
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override;

  // The current stage's state and the step results from `results_since` on,
  // for the heartbeat to the scheduler; nullopt without a stage.
  std::optional<v1::StageReport> Report(int64_t results_since) const;

  // The executor of `job_id`, or NotFound / FailedPrecondition.
  absl::StatusOr<std::shared_ptr<StageExecutor>> Executor(
      const std::string& job_id) const;
  const StageServiceOptions& options() const { return options_; }
  StageMetrics* metrics() const { return metrics_; }

 private:
  absl::Status DoConfigure(const v1::StageConfig& config,
                           v1::ConfigureResponse* response);
  absl::Status DoTrain(const v1::TrainRequest& request,
                       v1::TrainResponse* response);
  // Stops the current stage, if any, and forgets it.
  void DropCurrent();

  // Constant after construction.
  const std::unique_ptr<Backend> backend_;
  StageMetrics* const metrics_;  // borrowed, may be null
  const StageServiceOptions options_;
  ControlQueue control_;

  mutable std::mutex mu_;
  std::shared_ptr<StageExecutor> executor_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DownstreamStream> downstream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_STAGE_SERVICE_H_
