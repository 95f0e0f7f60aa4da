#include "services/scheduler_service.h"

#include <chrono>

#include "services/grpc_util.h"

namespace pipetrain {

void ControlCallMetrics::Record(const std::string& method,
                                const char* transport, double seconds,
                                const absl::Status& status) {
  if (registry_ == nullptr) return;
  auto h = registry_->GetHistogram(
      "pipetrain_scheduler_control_call_seconds",
      "Latency of scheduler control calls.", ExponentialBuckets(0.0001, 4, 10),
      {{"method", method}, {"transport", transport}});
  if (h.ok()) (*h)->Observe(seconds);
  if (!status.ok()) {
    auto c = registry_->GetCounter(
        "pipetrain_scheduler_control_call_errors_total",
        "Scheduler control calls that returned an error.",
        {{"method", method},
         {"transport", transport},
         {"code", absl::StatusCodeToString(status.code())}});
    if (c.ok()) (*c)->Increment();
  }
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

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
