// The scheduler's gRPC edge: the SchedulerService on the callback API. Each
// call is one SchedulerCore method taking and returning the proto messages
// (the REST gateway calls the same methods, see rest_gateway.h), so no call
// is written twice.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
#define PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_

#include <functional>
#include <string>

#include "pipetrain/v1/scheduler.grpc.pb.h"
#include "scheduler/scheduler_core.h"
#include "services/auth/access_policy.h"
#include "services/rpc/control_queue.h"
#include "services/scheduler/control_call_metrics.h"

namespace pipetrain {

// Who may call: user calls need a bearer token whose role the access table
// (services/auth/access_policy.h) allows; worker calls need the join token,
// and a worker id stays bound to the identity that registered it.
struct SchedulerAccess {
  ApiAuthorizer api;       // open by default
  std::string join_token;  // empty: none required
};

// Thread-safe. Calls that talk to workers (pause, resume, cancel, evaluate)
// run on the service's control thread, not in gRPC reactions. Every call is
// authorized first, by its method name, before it reaches the core.
class SchedulerServiceImpl final
    : public v1::SchedulerService::CallbackService {
 public:
  SchedulerServiceImpl(SchedulerCore* core, ControlCallMetrics* metrics,
                       SchedulerAccess access = {});

  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* c, const v1::RegisterWorkerRequest* q,
      v1::RegisterWorkerResponse* r) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* c,
                                      const v1::HeartbeatRequest* q,
                                      v1::HeartbeatResponse* r) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* c,
                                      const v1::SubmitJobRequest* q,
                                      v1::Job* r) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* c,
                                   const v1::GetJobRequest* q,
                                   v1::Job* r) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* c,
                                     const v1::ListJobsRequest* q,
                                     v1::ListJobsResponse* r) override;
  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* c,
                                     const v1::JobActionRequest* q,
                                     v1::Job* r) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* c,
                                      const v1::JobActionRequest* q,
                                      v1::Job* r) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* c,
                                      const v1::JobActionRequest* q,
                                      v1::Job* r) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* c,
                                        const v1::ListWorkersRequest* q,
                                        v1::ListWorkersResponse* r) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* c,
                                    const v1::GetPlanRequest* q,
                                    v1::Plan* r) override;
  grpc::ServerUnaryReactor* GetVersions(grpc::CallbackServerContext* c,
                                        const v1::GetVersionsRequest* q,
                                        v1::GetVersionsResponse* r) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* c,
                                     const v1::EvaluateRequest* q,
                                     v1::EvalResult* r) override;
  grpc::ServerUnaryReactor* GetJobTrace(grpc::CallbackServerContext* c,
                                        const v1::GetJobTraceRequest* q,
                                        v1::GetJobTraceResponse* r) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* c, const v1::ListCheckpointsRequest* q,
      v1::ListCheckpointsResponse* r) override;
  grpc::ServerUnaryReactor* CheckpointJob(
      grpc::CallbackServerContext* c, const v1::CheckpointJobRequest* q,
      v1::CheckpointJobResponse* r) override;
  // Streams the export in ~1 MiB chunks; built on the control thread.
  grpc::ServerWriteReactor<v1::ExportModelChunk>* ExportModel(
      grpc::CallbackServerContext* c, const v1::ExportModelRequest* q) override;
  grpc::ServerUnaryReactor* RemoveWorker(grpc::CallbackServerContext* c,
                                         const v1::RemoveWorkerRequest* q,
                                         v1::RemoveWorkerResponse* r) override;

 private:
  // Authorizes `name` for the caller, then runs `call` (on the control
  // thread when it talks to workers) and answers with its result.
  template <typename Resp>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context,
                                  Resp* response, const char* name,
                                  bool talks_to_workers,
                                  std::function<absl::StatusOr<Resp>()> call);

  // Constant after construction.
  SchedulerCore* const core_;          // borrowed
  ControlCallMetrics* const metrics_;  // borrowed
  const SchedulerAccess access_;
  ControlQueue slow_calls_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
