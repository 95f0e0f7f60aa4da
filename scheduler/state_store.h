// StateStore: the scheduler's durable state in SQLite, in its data
// directory: jobs, workers seen, plans and the weight-version ledger. A
// scheduler restarted (even after SIGKILL) reloads what it had.
//
// Records are the scheduler's protobuf messages, stored serialized beside
// the key columns they are looked up by, so the schema does not change when
// a message gains a field.
//
// Durable on return: WAL journal with synchronous=FULL, so a call that
// returned OK survives a SIGKILL (and an OS crash) of the scheduler.
// Errors: kUnavailable for I/O, busy or cannot-open (retry), kDataLoss for
// a corrupt file or a record that does not parse, kInternal otherwise;
// messages name the operation and the database path.
//
// Thread-safe: one connection, guarded by a mutex; every call holds it for
// its whole duration (calls are serialized, including reads).
#ifndef PIPETRAIN_SCHEDULER_STATE_STORE_H_
#define PIPETRAIN_SCHEDULER_STATE_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {

class StateStore {
 public:
  // Opens (creating when missing, with parents) `data_dir`/scheduler.db.
  // Unavailable when the directory cannot be created or the file cannot be
  // opened; DataLoss when the file is not a database; FailedPrecondition
  // for a schema version this binary does not know (messages name the path).
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(
      const std::string& data_dir);
  ~StateStore();

  // Inserts or replaces by id (InvalidArgument when the id is empty).
  absl::Status PutJob(const v1::Job& job);
  // By created_unix_ms, ties in the order first stored.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs() const;
  absl::Status PutWorker(const v1::WorkerInfo& worker);
  // Forgets a worker (no error when unknown).
  absl::Status DeleteWorker(const std::string& id);
  absl::StatusOr<std::vector<v1::WorkerInfo>> LoadWorkers() const;  // by id
  absl::Status PutPlan(const v1::Plan& plan);  // one per job
  absl::StatusOr<std::optional<v1::Plan>> LoadPlan(
      const std::string& job_id) const;

  // Appends ledger entries (stage, step, version) of a job; an entry for an
  // existing (job, stage, step) replaces it.
  // All or none: one transaction.
  absl::Status AppendVersions(const std::string& job_id,
                              const std::vector<v1::VersionEntry>& entries);
  // Entries with step >= since_step, ordered by step then stage.
  absl::StatusOr<std::vector<v1::VersionEntry>> LoadVersions(
      const std::string& job_id, int64_t since_step) const;

  // Small named values (e.g. the next job number).
  absl::Status PutMeta(const std::string& key, const std::string& value);
  absl::StatusOr<std::optional<std::string>> GetMeta(
      const std::string& key) const;

 private:
  class Impl;
  explicit StateStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STATE_STORE_H_
