// StateWriter: write-behind persistence of the scheduler's state. Callers
// queue records (jobs, plans, workers, version-ledger entries) while they
// hold their own locks, which costs a copy; Flush() writes the queue to the
// StateStore later, from a thread that holds none of the locks the network
// handlers (Heartbeat, Register, Get*) take. An fsync therefore never
// stalls a heartbeat.
//
// Ordering: the newest record per job, plan or worker wins (an older
// queued copy is replaced); ledger entries are written in the order they
// were queued. Flushes are serialized, so a later flush never writes an
// older record over a newer one. A record that fails to write stays queued
// (unless a newer one replaced it) and is retried by the next flush.
//
// Thread-safe. Queueing takes a short internal lock and never does I/O.
#ifndef PIPETRAIN_SCHEDULER_STATE_WRITER_H_
#define PIPETRAIN_SCHEDULER_STATE_WRITER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/state_store.h"

namespace pipetrain {

class StateWriter {
 public:
  // `store` is borrowed and must outlive the writer; null keeps nothing
  // (an in-memory scheduler): records are dropped as they are queued.
  explicit StateWriter(StateStore* store);

  void PutJob(const v1::Job& job);
  void PutPlan(const v1::Plan& plan);
  void PutWorker(const v1::WorkerInfo& worker);
  // Deletes the worker's record (replacing a queued put).
  void RemoveWorker(const std::string& id);
  void AppendVersions(const std::string& job_id,
                      const std::vector<v1::VersionEntry>& entries);

  // Writes everything queued before the call. Returns the first error
  // (every failed record is logged and stays queued).
  absl::Status Flush();

  // Records waiting for a flush (for tests and metrics).
  size_t pending() const;

  // Durability marks. Every queued record takes the next sequence number
  // (from 1); durable_sequence() is the highest number a flush has written
  // together with every record queued before it. A writer without a store
  // keeps nothing: both stay 0.
  uint64_t queued_sequence() const;
  uint64_t durable_sequence() const;

 private:
  struct Queue {
    std::map<std::string, v1::Job> jobs;
    std::map<std::string, v1::Plan> plans;
    // nullopt: delete the record.
    std::map<std::string, std::optional<v1::WorkerInfo>> workers;
    std::map<std::string, std::vector<v1::VersionEntry>> versions;
  };
  absl::Status WriteAll(Queue* queue);
  // Puts back what failed, behind nothing newer.
  void Requeue(Queue failed);

  StateStore* const store_;  // borrowed, may be null

  // Serializes flushes; held during I/O. Never taken under mu_.
  absl::Mutex io_mu_;
  mutable absl::Mutex mu_;
  Queue queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STATE_WRITER_H_
