// CheckpointCatalog: the SQLite catalog of committed checkpoints, the
// commit point of the checkpoint store (checkpoint_store.h). A row exists
// only for a checkpoint whose every layer file was durable before the row
// was inserted; rows are inserted and deleted in transactions, durable on
// return (WAL, synchronous=FULL).
//
// Its own database file (not scheduler.db): the catalog lives beside the
// files it describes, and the two stores evolve their schemas apart.
//
// Errors: kUnavailable for I/O, busy or cannot-open (retry), kDataLoss for
// a corrupt database, kAlreadyExists for a checkpoint inserted twice,
// kInternal otherwise; messages name the database path.
//
// Not thread-safe: owned by CheckpointStore, which calls it under its lock.
#ifndef PIPETRAIN_SCHEDULER_CHECKPOINT_CATALOG_H_
#define PIPETRAIN_SCHEDULER_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;

namespace pipetrain {

// A committed checkpoint, as listed.
struct CheckpointInfo {
  std::string job_id;
  int64_t version = 0;          // the weight version it holds
  int64_t step = 0;             // the step boundary (resume at this step)
  int64_t optimizer_steps = 0;  // optimizer steps taken (Adam's t)
  int64_t bytes = 0;            // all layer files together
  int64_t created_unix_ms = 0;  // when it was committed
  int num_layers = 0;
  double write_seconds = 0;  // time spent writing its files and committing
};

// One layer file of a checkpoint, as the catalog remembers it.
struct CheckpointLayerRecord {
  int layer = 0;
  int64_t bytes = 0;
  uint32_t crc32 = 0;  // zlib's CRC-32 of the whole file
};

struct CheckpointRecord {
  CheckpointInfo info;
  std::string spec_json;                      // the job's TrainingSpec
  std::vector<CheckpointLayerRecord> layers;  // by layer, 0..num_layers-1
};

class CheckpointCatalog {
 public:
  // Opens (creating when missing) the database at `db_path`; its directory
  // must exist.
  static absl::StatusOr<std::unique_ptr<CheckpointCatalog>> Open(
      const std::string& db_path);
  ~CheckpointCatalog();
  CheckpointCatalog(const CheckpointCatalog&) = delete;
  CheckpointCatalog& operator=(const CheckpointCatalog&) = delete;

  // Inserts the checkpoint and its layers, then deletes all but the `keep`
  // newest checkpoints of the job, in one transaction (so no crash leaves
  // more than `keep` listed). Returns the versions deleted.
  absl::StatusOr<std::vector<int64_t>> Insert(const CheckpointRecord& record,
                                              int keep);
  // A job's checkpoints, newest version first.
  absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job_id);
  absl::StatusOr<std::optional<CheckpointRecord>> Get(const std::string& job_id,
                                                      int64_t version);
  absl::Status DeleteJob(const std::string& job_id);
  // Every committed (job, version, num_layers), for the cleanup at open.
  struct Committed {
    std::string job_id;
    int64_t version;
    int num_layers;
  };
  absl::StatusOr<std::vector<Committed>> AllCommitted();

 private:
  CheckpointCatalog(std::string db_path, sqlite3* db)
      : db_path_(std::move(db_path)), db_(db) {}
  class Query;
  absl::Status Error(int rc, const std::string& op) const;
  absl::Status Exec(const char* sql, const std::string& op);
  absl::Status Setup();
  absl::Status InTransaction(const std::string& op,
                             const std::function<absl::Status()>& body);
  absl::Status InsertRows(const CheckpointRecord& record);
  absl::StatusOr<std::vector<int64_t>> DeleteOld(const std::string& job_id,
                                                 int keep);

  const std::string db_path_;
  sqlite3* db_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_CHECKPOINT_CATALOG_H_
