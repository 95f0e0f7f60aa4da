#include "worker/pipeline/stage_port.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace pipetrain {

StagePort::StagePort(double recv_timeout_s, StageMetrics* metrics)
    : recv_timeout_s_(recv_timeout_s > 0 ? recv_timeout_s : 120.0),
      metrics_(metrics) {}

void StagePort::SetDownstream(std::shared_ptr<StageLink> link) {
  absl::MutexLock lock(&mu_);
  downstream_ = std::move(link);
}

void StagePort::SetUpstream(std::shared_ptr<StageLink> link) {
  absl::MutexLock lock(&mu_);
  upstream_ = std::move(link);
}

bool StagePort::SetUpstreamIfNone(std::shared_ptr<StageLink> link) {
  absl::MutexLock lock(&mu_);
  if (upstream_ != nullptr) return false;
  upstream_ = std::move(link);
  return true;
}

void StagePort::ClearUpstream(const StageLink* link) {
  absl::MutexLock lock(&mu_);
  if (upstream_.get() == link) upstream_.reset();
}

bool StagePort::has_downstream() const {
  absl::MutexLock lock(&mu_);
  return downstream_ != nullptr;
}

absl::Status StagePort::SendOn(const std::shared_ptr<StageLink>& link,
                               StageMessage message) {
  if (link == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no link to send the ", MessageKindName(message.kind), " on"));
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  absl::Status status = link->Send(std::move(message));
  if (metrics_ != nullptr) {
    metrics_->send_seconds()->Increment(
        std::chrono::duration<double>(Clock::now() - start).count());
  }
  return status;
}

absl::Status StagePort::SendDownstream(StageMessage message) {
  std::shared_ptr<StageLink> link;
  {
    absl::MutexLock lock(&mu_);
    link = downstream_;
  }
  return SendOn(link, std::move(message));
}

absl::Status StagePort::SendUpstream(StageMessage message) {
  std::shared_ptr<StageLink> link;
  {
    absl::MutexLock lock(&mu_);
    link = upstream_;
  }
  return SendOn(link, std::move(message));
}

absl::StatusOr<StageMessage> StagePort::Receive(MessageKind kind, int64_t step,
                                                int mb, int chunk,
                                                double* idle_seconds) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto msg = mailbox_.Receive(
      kind, step, mb, chunk,
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(recv_timeout_s_)));
  CountIdle(start, idle_seconds);
  return msg;
}

bool StagePort::WaitFor(MessageKind kind, int64_t step, int mb, int chunk,
                        std::chrono::steady_clock::duration wait,
                        double* idle_seconds) {
  const auto start = std::chrono::steady_clock::now();
  const bool ready = mailbox_.WaitReady(kind, step, mb, chunk, start + wait);
  CountIdle(start, idle_seconds);
  return ready;
}

void StagePort::CountIdle(std::chrono::steady_clock::time_point start,
                          double* idle_seconds) {
  const double idle =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  *idle_seconds += idle;
  if (metrics_ != nullptr) metrics_->idle_seconds()->Increment(idle);
}

}  // namespace pipetrain
