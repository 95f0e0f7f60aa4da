#include "services/scheduler/scheduler_service.h"

#include <chrono>

#include "services/rpc/grpc_util.h"

namespace pipetrain {

SchedulerServiceImpl::SchedulerServiceImpl(SchedulerCore* core,
                                           ControlCallMetrics* metrics)
    : core_(core), metrics_(metrics) {}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* SchedulerServiceImpl::Serve(
    grpc::CallbackServerContext* context, const Req* request, Resp* response,
    absl::StatusOr<Resp> (SchedulerCore::*method)(const Req&), const char* name,
    bool talks_to_workers) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto run = [this, reactor, request, response, method, name] {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Resp> result = (core_->*method)(*request);
    if (result.ok()) *response = std::move(*result);
    metrics_->Record(
        name, "grpc",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        result.status());
    reactor->Finish(ToGrpcStatus(result.status()));
  };
  if (talks_to_workers) {
    slow_calls_.Post(run);
  } else {
    run();
  }
  return reactor;
}

#define PT_SERVE(Method, Req, Resp, slow)                                    \
  grpc::ServerUnaryReactor* SchedulerServiceImpl::Method(                    \
      grpc::CallbackServerContext* c, const Req* q, Resp* r) {               \
    return Serve<Req, Resp>(c, q, r, &SchedulerCore::Method, #Method, slow); \
  }

PT_SERVE(RegisterWorker, v1::RegisterWorkerRequest, v1::RegisterWorkerResponse,
         false)
PT_SERVE(Heartbeat, v1::HeartbeatRequest, v1::HeartbeatResponse, false)
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

#undef PT_SERVE

}  // namespace pipetrain
