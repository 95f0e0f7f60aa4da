#include "services/worker/worker_agent.h"

#include <chrono>

#include "common/logging.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {

WorkerAgent::WorkerAgent(const std::string& scheduler_address,
                         v1::WorkerInfo info, const StageHost* host)
    : scheduler_address_(scheduler_address),
      host_(host),
      stub_(v1::SchedulerService::NewStub(
          CreatePipetrainChannel(scheduler_address))),
      info_(std::move(info)) {
  thread_ = std::thread([this] { Loop(); });
}

WorkerAgent::~WorkerAgent() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status WorkerAgent::Register() {
  v1::RegisterWorkerRequest request;
  *request.mutable_worker() = info_;
  v1::RegisterWorkerResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  RETURN_IF_ERROR(
      FromGrpcStatus(stub_->RegisterWorker(&ctx, request, &response)));
  info_.set_id(response.worker_id());
  if (response.heartbeat_interval_seconds() > 0) {
    interval_s_ = response.heartbeat_interval_seconds();
  }
  registered_ = true;
  PT_LOG(INFO) << "registered with the scheduler at " << scheduler_address_
               << " as " << info_.id();
  return absl::OkStatus();
}

absl::Status WorkerAgent::Beat() {
  v1::HeartbeatRequest request;
  request.set_worker_id(info_.id());
  std::optional<v1::StageReport> report = host_->Report(reported_since_);
  if (report.has_value() && report->job_id() != reported_job_) {
    // A new stage: report its results from the start.
    report = host_->Report(0);
  }
  int64_t next_since = reported_since_;
  if (report.has_value()) {
    for (const auto& r : report->status().results()) {
      next_since = std::max(next_since, r.step() + 1);
    }
    *request.mutable_report() = *report;
  }
  v1::HeartbeatResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Heartbeat(&ctx, request, &response)));
  if (report.has_value()) {
    if (report->job_id() != reported_job_) {
      reported_job_ = report->job_id();
      next_since = 0;
      for (const auto& r : report->status().results()) {
        next_since = std::max(next_since, r.step() + 1);
      }
    }
    reported_since_ = next_since;
  }
  if (response.register_again()) registered_ = false;
  return absl::OkStatus();
}

void WorkerAgent::Loop() {
  bool warned = false;
  while (true) {
    absl::Status status = registered_ ? Beat() : Register();
    if (!status.ok() && !warned) {
      PT_LOG(WARNING) << "scheduler at " << scheduler_address_
                      << " unreachable: " << status << " (retrying)";
      warned = true;
    } else if (status.ok()) {
      warned = false;
    }
    absl::MutexLock lock(&mu_);
    auto stopping = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping),
                             absl::Seconds(status.ok() ? interval_s_ : 0.5))) {
      return;
    }
  }
}

}  // namespace pipetrain
