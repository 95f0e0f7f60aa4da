// The scheduler's gRPC edge: the SchedulerService on the callback API. Each
// call is one SchedulerCore method taking and returning the proto messages
// (the REST gateway calls the same methods, see rest_gateway.h), so no call
// is written twice.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
#define PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_

#include <string>

#include "pipetrain/v1/scheduler.grpc.pb.h"
#include "scheduler/scheduler_core.h"
#include "services/rpc/control_queue.h"
#include "services/scheduler/control_call_metrics.h"

namespace pipetrain {

// Thread-safe. Calls that talk to workers (pause, resume, cancel, evaluate)
// run on the service's control thread, not in gRPC reactions.
class SchedulerServiceImpl final
    : public v1::SchedulerService::CallbackService {
 public:
  SchedulerServiceImpl(SchedulerCore* core, ControlCallMetrics* metrics);

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

 private:
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Serve(
      grpc::CallbackServerContext* context, const Req* request, Resp* response,
      absl::StatusOr<Resp> (SchedulerCore::*method)(const Req&),
      const char* name, bool talks_to_workers);

  SchedulerCore* const core_;          // borrowed
  ControlCallMetrics* const metrics_;  // borrowed
  ControlQueue slow_calls_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
