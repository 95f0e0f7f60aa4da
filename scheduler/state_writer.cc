#include "scheduler/state_writer.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace pipetrain {

StateWriter::StateWriter(StateStore* store) : store_(store) {}

void StateWriter::PutJob(const v1::Job& job) {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  queue_.jobs[job.id()] = job;
  ++queued_sequence_;
}

void StateWriter::PutPlan(const v1::Plan& plan) {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  queue_.plans[plan.job_id()] = plan;
  ++queued_sequence_;
}

void StateWriter::PutWorker(const v1::WorkerInfo& worker) {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  queue_.workers[worker.id()] = worker;
  ++queued_sequence_;
}

void StateWriter::RemoveWorker(const std::string& id) {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  queue_.workers[id] = std::nullopt;
  ++queued_sequence_;
}

void StateWriter::AppendVersions(const std::string& job_id,
                                 const std::vector<v1::VersionEntry>& entries) {
  if (store_ == nullptr || entries.empty()) return;
  absl::MutexLock lock(&mu_);
  auto& queued = queue_.versions[job_id];
  queued.insert(queued.end(), entries.begin(), entries.end());
  ++queued_sequence_;
}

size_t StateWriter::pending() const {
  absl::MutexLock lock(&mu_);
  size_t n = queue_.jobs.size() + queue_.plans.size() + queue_.workers.size();
  for (const auto& [id, entries] : queue_.versions) n += entries.size();
  return n;
}

absl::Status StateWriter::Flush() {
  if (store_ == nullptr) return absl::OkStatus();
  absl::MutexLock io(&io_mu_);
  Queue taken;
  uint64_t through = 0;
  {
    absl::MutexLock lock(&mu_);
    std::swap(taken, queue_);
    through = queued_sequence_;
  }
  const absl::Status status = WriteAll(&taken);
  Requeue(std::move(taken));
  // A failed record stays queued: nothing after it counts as written until
  // a later flush writes it.
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    durable_sequence_ = std::max(durable_sequence_, through);
  }
  return status;
}

uint64_t StateWriter::queued_sequence() const {
  absl::MutexLock lock(&mu_);
  return queued_sequence_;
}

uint64_t StateWriter::durable_sequence() const {
  absl::MutexLock lock(&mu_);
  return durable_sequence_;
}

// Writes every record of `queue`, removing those written; what remains
// failed.
absl::Status StateWriter::WriteAll(Queue* queue) {
  absl::Status first;
  auto note = [&first](const absl::Status& s, const std::string& what) {
    if (s.ok()) return true;
    PT_LOG(ERROR) << "cannot persist " << what << ": " << s;
    if (first.ok()) first = s;
    return false;
  };
  // Plans before jobs: a job that refers to its plan finds it after a crash.
  for (auto it = queue->plans.begin(); it != queue->plans.end();) {
    const bool ok = note(store_->PutPlan(it->second), "plan of " + it->first);
    it = ok ? queue->plans.erase(it) : std::next(it);
  }
  for (auto it = queue->jobs.begin(); it != queue->jobs.end();) {
    const bool ok = note(store_->PutJob(it->second), it->first);
    it = ok ? queue->jobs.erase(it) : std::next(it);
  }
  for (auto it = queue->workers.begin(); it != queue->workers.end();) {
    const bool ok =
        note(it->second.has_value() ? store_->PutWorker(*it->second)
                                    : store_->DeleteWorker(it->first),
             "worker " + it->first);
    it = ok ? queue->workers.erase(it) : std::next(it);
  }
  for (auto it = queue->versions.begin(); it != queue->versions.end();) {
    const bool ok = note(store_->AppendVersions(it->first, it->second),
                         "version ledger of " + it->first);
    it = ok ? queue->versions.erase(it) : std::next(it);
  }
  return first;
}

void StateWriter::Requeue(Queue failed) {
  absl::MutexLock lock(&mu_);
  // emplace keeps a newer record queued meanwhile.
  for (auto& [id, job] : failed.jobs) queue_.jobs.emplace(id, std::move(job));
  for (auto& [id, plan] : failed.plans) {
    queue_.plans.emplace(id, std::move(plan));
  }
  for (auto& [id, w] : failed.workers) queue_.workers.emplace(id, std::move(w));
  for (auto& [id, entries] : failed.versions) {
    auto& queued = queue_.versions[id];
    entries.insert(entries.end(), queued.begin(), queued.end());
    queued = std::move(entries);
  }
}

}  // namespace pipetrain
