#include "scheduler/worker_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/status_macros.h"

namespace pipetrain {

WorkerRegistry::WorkerRegistry(const RegistryOptions& options,
                               StateWriter* writer)
    : options_(options), writer_(writer) {}

void WorkerRegistry::Persist(const v1::WorkerInfo& w) {
  if (writer_ != nullptr) writer_->PutWorker(w);
}

void WorkerRegistry::Load(std::vector<v1::WorkerInfo> loaded, int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  for (v1::WorkerInfo& w : loaded) {
    w.set_last_heartbeat_unix_ms(now_ms);
    if (!workers_.count(w.id())) order_.push_back(w.id());
    int64_t n = 0;
    if (sscanf(w.id().c_str(), "w-%ld", &n) == 1) {
      next_id_ = std::max(next_id_, n + 1);
    }
    workers_[w.id()] = w;
  }
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerRegistry::Register(
    v1::WorkerInfo info, int64_t now_ms, const WorkerAdmission& admission) {
  if (info.address().empty()) {
    return absl::InvalidArgumentError(
        "worker.address: missing (the host:port the scheduler dials)");
  }
  absl::MutexLock lock(&mu_);
  if (info.id().empty()) {
    // Skip ids taken by workers that chose their own.
    do {
      info.set_id(absl::StrCat("w-", next_id_++));
    } while (workers_.count(info.id()));
  }
  auto it = workers_.find(info.id());
  if (it == workers_.end()) {
    order_.push_back(info.id());
    info.set_registered_unix_ms(now_ms);
  } else {
    auto secret = secrets_.find(info.id());
    const bool proven =
        admission.identity_verified || secret == secrets_.end() ||
        ConstantTimeEquals(secret->second, admission.presented_secret);
    if (it->second.identity() != admission.identity || !proven) {
      PT_LOG(WARNING) << "refused to re-register worker " << info.id()
                      << " for " << admission.identity << ": it belongs to "
                      << it->second.identity();
      return absl::PermissionDeniedError(absl::StrCat(
          "worker id ", info.id(),
          " is registered to another identity; register without an id"));
    }
    info.set_registered_unix_ms(it->second.registered_unix_ms());
  }
  // A (re)registering worker carries no stage yet.
  info.set_identity(admission.identity);
  info.set_state(v1::WORKER_STATE_REGISTERED);
  info.clear_job_id();
  info.set_stage(0);
  info.set_last_heartbeat_unix_ms(now_ms);
  workers_[info.id()] = info;
  secrets_[info.id()] = admission.new_secret;
  Persist(info);
  PT_LOG(INFO) << "worker " << info.id() << " registered at " << info.address()
               << " (" << info.device() << ") by " << admission.identity;
  v1::RegisterWorkerResponse out;
  out.set_worker_id(info.id());
  out.set_heartbeat_interval_seconds(options_.heartbeat_interval_seconds);
  out.set_lease_seconds(options_.lease_seconds);
  out.set_worker_secret(admission.new_secret);
  return out;
}

absl::Status WorkerRegistry::CheckCaller(const std::string& id,
                                         const std::string& identity,
                                         const std::string& secret) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker ", id));
  }
  if (it->second.identity() != identity) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", id, " is registered to another identity (caller: ", identity,
        ")"));
  }
  auto bound = secrets_.find(id);
  if (bound == secrets_.end()) {
    // Restored from disk: keep it, bound to what its owner presents now.
    secrets_[id] = secret;
    return absl::OkStatus();
  }
  if (!ConstantTimeEquals(bound->second, secret)) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", id, ": wrong secret from ", identity));
  }
  return absl::OkStatus();
}

bool WorkerRegistry::Heartbeat(const std::string& id, int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  v1::WorkerInfo& w = it->second;
  w.set_last_heartbeat_unix_ms(now_ms);
  if (w.state() == v1::WORKER_STATE_REGISTERED ||
      w.state() == v1::WORKER_STATE_LOST) {
    if (w.state() == v1::WORKER_STATE_LOST) {
      PT_LOG(INFO) << "worker " << id << " is back";
    }
    w.set_state(w.job_id().empty() ? v1::WORKER_STATE_IDLE
                                   : v1::WORKER_STATE_ASSIGNED);
    Persist(w);
  }
  return true;
}

std::vector<std::string> WorkerRegistry::Sweep(int64_t now_ms) {
  std::vector<std::string> lost;
  const int64_t lease_ms = static_cast<int64_t>(options_.lease_seconds * 1000);
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : workers_) {
    if (w.state() != v1::WORKER_STATE_LOST &&
        now_ms - w.last_heartbeat_unix_ms() > lease_ms) {
      PT_LOG(WARNING) << "worker " << id << " missed its lease";
      w.set_state(v1::WORKER_STATE_LOST);
      Persist(w);
      lost.push_back(id);
    }
  }
  if (options_.lost_expiry_seconds <= 0) return lost;
  const int64_t expiry_ms =
      lease_ms + static_cast<int64_t>(options_.lost_expiry_seconds * 1000);
  std::vector<std::string> expired;
  for (const auto& [id, w] : workers_) {
    if (w.state() == v1::WORKER_STATE_LOST &&
        now_ms - w.last_heartbeat_unix_ms() > expiry_ms) {
      expired.push_back(id);
    }
  }
  for (const std::string& id : expired) {
    PT_LOG(INFO) << "worker " << id << " expired after being lost";
    Forget(id);
  }
  return lost;
}

absl::Status WorkerRegistry::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker '", id, "'"));
  }
  if (it->second.state() == v1::WORKER_STATE_ASSIGNED) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id, " runs stage ", it->second.stage(), " of ",
                     it->second.job_id(),
                     "; cancel the job or stop the worker "
                     "first"));
  }
  Forget(id);
  return absl::OkStatus();
}

void WorkerRegistry::Forget(const std::string& id) {
  workers_.erase(id);
  for (auto& [other, w] : workers_) {
    auto* links = w.mutable_links();
    links->erase(std::remove_if(links->begin(), links->end(),
                                [&](const v1::LinkMeasurement& l) {
                                  return l.to_worker_id() == id;
                                }),
                 links->end());
  }
  for (auto it = probe_asked_ms_.begin(); it != probe_asked_ms_.end();) {
    const bool names = it->first.first == id || it->first.second == id;
    it = names ? probe_asked_ms_.erase(it) : std::next(it);
  }
  for (auto it = probe_wanted_.begin(); it != probe_wanted_.end();) {
    const bool names = it->first == id || it->second == id;
    it = names ? probe_wanted_.erase(it) : std::next(it);
  }
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  if (writer_ != nullptr) writer_->RemoveWorker(id);
}

std::vector<v1::WorkerInfo> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const std::string& id : order_) out.push_back(workers_.at(id));
  return out;
}

std::optional<v1::WorkerInfo> WorkerRegistry::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

std::vector<v1::WorkerInfo> WorkerRegistry::Idle(
    const google::protobuf::Map<std::string, std::string>& selector) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const std::string& id : order_) {
    const v1::WorkerInfo& w = workers_.at(id);
    if (w.state() != v1::WORKER_STATE_IDLE) continue;
    bool match = true;
    for (const auto& [key, value] : selector) {
      auto label = w.labels().find(key);
      if (label == w.labels().end() || label->second != value) match = false;
    }
    if (match) out.push_back(w);
  }
  return out;
}

int WorkerRegistry::CountAlive() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, w] : workers_) n += w.state() != v1::WORKER_STATE_LOST;
  return n;
}

absl::Status WorkerRegistry::Assign(const std::string& id,
                                    const std::string& job_id, int stage) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.state() != v1::WORKER_STATE_IDLE) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id, " is not idle"));
  }
  it->second.set_state(v1::WORKER_STATE_ASSIGNED);
  it->second.set_job_id(job_id);
  it->second.set_stage(stage);
  Persist(it->second);
  return absl::OkStatus();
}

absl::Status WorkerRegistry::AssignJob(
    const std::string& job_id,
    const std::vector<std::pair<std::string, int>>& stages) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int> wanted;
  for (const auto& [id, stage] : stages) {
    auto it = workers_.find(id);
    const bool usable = it != workers_.end() &&
                        (it->second.state() == v1::WORKER_STATE_IDLE ||
                         (it->second.state() == v1::WORKER_STATE_ASSIGNED &&
                          it->second.job_id() == job_id));
    if (!usable) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", id, " is neither idle nor in ", job_id));
    }
    wanted[id] = stage;
  }
  for (auto& [id, w] : workers_) {
    auto want = wanted.find(id);
    if (want == wanted.end()) {
      if (w.job_id() != job_id) continue;
      w.clear_job_id();
      w.set_stage(0);
      if (w.state() == v1::WORKER_STATE_ASSIGNED) {
        w.set_state(v1::WORKER_STATE_IDLE);
      }
    } else {
      w.set_state(v1::WORKER_STATE_ASSIGNED);
      w.set_job_id(job_id);
      w.set_stage(want->second);
    }
    Persist(w);
  }
  return absl::OkStatus();
}

void WorkerRegistry::Release(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : workers_) {
    if (w.job_id() != job_id) continue;
    w.clear_job_id();
    w.set_stage(0);
    if (w.state() == v1::WORKER_STATE_ASSIGNED) {
      w.set_state(v1::WORKER_STATE_IDLE);
    }
    Persist(w);
  }
}

std::vector<v1::WorkerInfo> WorkerRegistry::AssignedTo(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const std::string& id : order_) {
    if (workers_.at(id).job_id() == job_id) out.push_back(workers_.at(id));
  }
  return out;
}

// ---- Links ----

bool WorkerRegistry::LinkDue(const v1::WorkerInfo& from, const std::string& to,
                             int64_t now_ms) const {
  const int64_t refresh_ms =
      static_cast<int64_t>(options_.link_refresh_seconds * 1000);
  for (const v1::LinkMeasurement& l : from.links()) {
    if (l.to_worker_id() == to) {
      return now_ms - l.measured_unix_ms() > refresh_ms;
    }
  }
  return true;
}

void WorkerRegistry::RecordLinks(
    const std::string& id,
    const google::protobuf::RepeatedPtrField<v1::LinkMeasurement>& links,
    int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  for (const v1::LinkMeasurement& measured : links) {
    const std::string& to = measured.to_worker_id();
    if (to == id || !workers_.count(to) ||
        !(measured.bandwidth_bytes_per_s() > 0) ||
        !(measured.rtt_seconds() >= 0)) {
      continue;
    }
    v1::LinkMeasurement* slot = nullptr;
    for (v1::LinkMeasurement& l : *it->second.mutable_links()) {
      if (l.to_worker_id() == to) slot = &l;
    }
    if (slot == nullptr) slot = it->second.add_links();
    *slot = measured;
    slot->set_measured_unix_ms(now_ms);
    slot->set_source("probe");
    probe_asked_ms_.erase({id, to});
    probe_wanted_.erase({id, to});
  }
}

std::vector<v1::ProbeTarget> WorkerRegistry::ProbesFor(const std::string& id,
                                                       int64_t now_ms) {
  std::vector<v1::ProbeTarget> out;
  absl::MutexLock lock(&mu_);
  auto self = workers_.find(id);
  if (self == workers_.end() || self->second.state() == v1::WORKER_STATE_LOST) {
    return out;
  }
  const int64_t retry_ms =
      static_cast<int64_t>(options_.probe_retry_seconds * 1000);
  // Workers measuring a link or being measured now (asked, not reported,
  // within the retry period): a measurement sharing an end with another
  // would time the other's traffic too.
  std::set<std::string> measuring;
  for (const auto& [pair, asked_ms] : probe_asked_ms_) {
    if (now_ms - asked_ms < retry_ms) {
      measuring.insert(pair.first);
      measuring.insert(pair.second);
    }
  }
  if (measuring.count(id)) return out;
  const bool self_busy = self->second.state() == v1::WORKER_STATE_ASSIGNED;
  for (const std::string& peer_id : order_) {
    const v1::WorkerInfo& peer = workers_.at(peer_id);
    if (peer_id == id || peer.state() == v1::WORKER_STATE_LOST ||
        peer.address().empty() || measuring.count(peer_id)) {
      continue;
    }
    const std::pair<std::string, std::string> pair{id, peer_id};
    const bool wanted = probe_wanted_.count(pair) > 0;
    const bool busy = self_busy || peer.state() == v1::WORKER_STATE_ASSIGNED;
    if (!wanted && (busy || !LinkDue(self->second, peer_id, now_ms))) continue;
    auto asked = probe_asked_ms_.find(pair);
    if (asked != probe_asked_ms_.end() && now_ms - asked->second < retry_ms) {
      continue;
    }
    probe_asked_ms_[pair] = now_ms;
    v1::ProbeTarget target;
    target.set_worker_id(peer_id);
    target.set_address(peer.address());
    target.set_identity(peer.identity());
    out.push_back(std::move(target));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> WorkerRegistry::DueLinks(
    const std::vector<std::string>& ids, int64_t now_ms) const {
  std::vector<std::pair<std::string, std::string>> due;
  for (const std::string& from : ids) {
    auto it = workers_.find(from);
    if (it == workers_.end()) continue;
    for (const std::string& to : ids) {
      if (to != from && LinkDue(it->second, to, now_ms)) {
        due.emplace_back(from, to);
      }
    }
  }
  return due;
}

int WorkerRegistry::WantProbes(const std::vector<std::string>& ids,
                               int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  const auto due = DueLinks(ids, now_ms);
  for (const auto& link : due) {
    // Asked at once, even if asked a moment ago for another reason.
    if (probe_wanted_.insert(link).second) probe_asked_ms_.erase(link);
  }
  return static_cast<int>(due.size());
}

int WorkerRegistry::MissingLinks(const std::vector<std::string>& ids,
                                 int64_t now_ms) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(DueLinks(ids, now_ms).size());
}

}  // namespace pipetrain
