#include "worker/pipeline/mailbox.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace pipetrain {

const char* MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kNormPartial:
      return "norm-partial";
    case MessageKind::kNormTotal:
      return "norm-total";
    case MessageKind::kEvalActivation:
      return "evaluation activation";
  }
  return "?";
}

absl::Status Mailbox::Deliver(StageMessage message) {
  const Key key{static_cast<int>(message.kind), message.step,
                message.micro_batch, message.chunk};
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    auto [it, inserted] = messages_.try_emplace(key, std::move(message));
    if (!inserted) {
      return absl::AlreadyExistsError(absl::StrCat(
          "duplicate ", MessageKindName(it->second.kind), " for step ",
          it->second.step, " micro-batch ", it->second.micro_batch,
          it->second.chunk != 0 ? absl::StrCat(" chunk ", it->second.chunk)
                                : ""));
    }
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StageMessage> Mailbox::Receive(
    MessageKind kind, int64_t step, int32_t micro_batch, int32_t chunk,
    std::chrono::steady_clock::time_point deadline) {
  const Key key{static_cast<int>(kind), step, micro_batch, chunk};
  absl::MutexLock lock(&mu_);
  if (!AwaitLocked(key, deadline)) {
    return absl::UnavailableError(
        absl::StrCat("timed out waiting for the ", MessageKindName(kind),
                     " of step ", step, " micro-batch ", micro_batch,
                     chunk != 0 ? absl::StrCat(" chunk ", chunk) : ""));
  }
  if (!failure_.ok()) return failure_;
  auto it = messages_.find(key);
  StageMessage out = std::move(it->second);
  messages_.erase(it);
  return out;
}

bool Mailbox::AwaitLocked(const Key& key,
                          std::chrono::steady_clock::time_point deadline) {
  while (failure_.ok() && messages_.count(key) == 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    cv_.WaitWithTimeout(&mu_, absl::FromChrono(deadline - now));
  }
  return true;
}

bool Mailbox::Ready(MessageKind kind, int64_t step, int32_t micro_batch,
                    int32_t chunk) const {
  const Key key{static_cast<int>(kind), step, micro_batch, chunk};
  absl::MutexLock lock(&mu_);
  return !failure_.ok() || messages_.count(key) > 0;
}

bool Mailbox::WaitReady(MessageKind kind, int64_t step, int32_t micro_batch,
                        int32_t chunk,
                        std::chrono::steady_clock::time_point deadline) {
  const Key key{static_cast<int>(kind), step, micro_batch, chunk};
  absl::MutexLock lock(&mu_);
  return AwaitLocked(key, deadline);
}

void Mailbox::Fail(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
  }
  cv_.SignalAll();
}

void Mailbox::Reset() {
  absl::MutexLock lock(&mu_);
  messages_.clear();
  failure_ = absl::OkStatus();
}

void Mailbox::DropBefore(int64_t step) {
  absl::MutexLock lock(&mu_);
  for (auto it = messages_.begin(); it != messages_.end();) {
    it = std::get<1>(it->first) < step ? messages_.erase(it) : std::next(it);
  }
}

size_t Mailbox::size() const {
  absl::MutexLock lock(&mu_);
  return messages_.size();
}

}  // namespace pipetrain
