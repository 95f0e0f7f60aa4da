#include "services/worker/worker_agent.h"

#include <chrono>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {

WorkerAgent::WorkerAgent(const std::string& scheduler_address,
                         v1::WorkerInfo info, const StageHost* host,
                         std::string join_token)
    : scheduler_address_(scheduler_address),
      host_(host),
      join_token_(std::move(join_token)),
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
  request.set_join_token(join_token_);
  request.set_worker_secret(secret_);
  v1::RegisterWorkerResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  RETURN_IF_ERROR(
      FromGrpcStatus(stub_->RegisterWorker(&ctx, request, &response)));
  info_.set_id(response.worker_id());
  secret_ = response.worker_secret();
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
  request.set_worker_secret(secret_);
  std::optional<v1::StageReport> report = host_->Report(cursor_.since());
  // A new stage: report its results from the start.
  if (report.has_value() && cursor_.IsNew(*report)) report = host_->Report(0);
  if (report.has_value()) *request.mutable_report() = *report;
  std::vector<v1::LinkMeasurement> links = prober_.Take();
  for (const v1::LinkMeasurement& l : links) *request.add_links() = l;
  v1::HeartbeatResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  const absl::Status sent =
      FromGrpcStatus(stub_->Heartbeat(&ctx, request, &response));
  if (!sent.ok()) {
    prober_.Return(std::move(links));
    return sent;
  }
  prober_.Enqueue({response.probe().begin(), response.probe().end()});
  cursor_.Answered(report.has_value() ? &*report : nullptr, response);
  if (response.register_again()) registered_ = false;
  return absl::OkStatus();
}

void WorkerAgent::Loop() {
  bool warned = false;
  while (true) {
    absl::Status status = registered_ ? Beat() : Register();
    // Once the scheduler answers again, report every result the stage
    // keeps (the ledger keeps one entry per step): it may have restarted.
    if (!status.ok()) cursor_.ReportAll();
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
