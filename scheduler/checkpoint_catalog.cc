#include "scheduler/checkpoint_catalog.h"

#include <sqlite3.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/sqlite_status.h"

namespace pipetrain {
namespace {

constexpr int kSchemaVersion = 1;
constexpr int kBusyTimeoutMs = 5000;

constexpr char kSchemaV1[] =
    "CREATE TABLE IF NOT EXISTS checkpoints("
    "  job_id TEXT NOT NULL, version INTEGER NOT NULL, step INTEGER,"
    "  optimizer_steps INTEGER, num_layers INTEGER, bytes INTEGER,"
    "  created_unix_ms INTEGER, write_seconds REAL, spec_json TEXT,"
    "  PRIMARY KEY(job_id, version));"
    "CREATE TABLE IF NOT EXISTS checkpoint_layers("
    "  job_id TEXT NOT NULL, version INTEGER NOT NULL, layer INTEGER NOT NULL,"
    "  bytes INTEGER, crc32 INTEGER, PRIMARY KEY(job_id, version, layer));";

constexpr char kInfoColumns[] =
    "job_id, version, step, optimizer_steps, num_layers, bytes,"
    " created_unix_ms, write_seconds";

std::string ColumnText(sqlite3_stmt* stmt, int col) {
  const auto* text =
      reinterpret_cast<const char*>(sqlite3_column_text(stmt, col));
  return std::string(text == nullptr ? "" : text,
                     static_cast<size_t>(sqlite3_column_bytes(stmt, col)));
}

CheckpointInfo InfoFromRow(sqlite3_stmt* stmt) {
  CheckpointInfo info;
  info.job_id = ColumnText(stmt, 0);
  info.version = sqlite3_column_int64(stmt, 1);
  info.step = sqlite3_column_int64(stmt, 2);
  info.optimizer_steps = sqlite3_column_int64(stmt, 3);
  info.num_layers = sqlite3_column_int(stmt, 4);
  info.bytes = sqlite3_column_int64(stmt, 5);
  info.created_unix_ms = sqlite3_column_int64(stmt, 6);
  info.write_seconds = sqlite3_column_double(stmt, 7);
  return info;
}

}  // namespace

// One prepared statement, finalized when it goes out of scope.
class CheckpointCatalog::Query {
 public:
  Query(CheckpointCatalog* catalog, const std::string& sql, std::string op)
      : catalog_(catalog), op_(std::move(op)) {
    rc_ = sqlite3_prepare_v2(catalog->db_, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Query() { sqlite3_finalize(stmt_); }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  // Binds in order; text is copied (SQLITE_TRANSIENT).
  Query& Bind(const std::string& text) {
    if (rc_ == SQLITE_OK) {
      rc_ = sqlite3_bind_text(stmt_, ++index_, text.c_str(),
                              static_cast<int>(text.size()), SQLITE_TRANSIENT);
    }
    return *this;
  }
  Query& Bind(int64_t v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_int64(stmt_, ++index_, v);
    return *this;
  }
  Query& Bind(double v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_double(stmt_, ++index_, v);
    return *this;
  }
  // Next row: true with a row, false when done.
  absl::StatusOr<bool> Step() {
    if (rc_ != SQLITE_OK) return catalog_->Error(rc_, op_);
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    rc_ = rc;
    return catalog_->Error(rc, op_);
  }
  absl::Status Run() { return Step().status(); }
  sqlite3_stmt* stmt() const { return stmt_; }

 private:
  CheckpointCatalog* catalog_;
  std::string op_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
  int index_ = 0;
};

absl::StatusOr<std::unique_ptr<CheckpointCatalog>> CheckpointCatalog::Open(
    const std::string& db_path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      db_path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  // The handle owns the connection even when opening failed.
  std::unique_ptr<CheckpointCatalog> catalog(
      new CheckpointCatalog(db_path, db));
  if (db == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint catalog ", db_path, ": out of memory"));
  }
  if (rc != SQLITE_OK) return catalog->Error(rc, "open");
  RETURN_IF_ERROR(catalog->Setup());
  return catalog;
}

CheckpointCatalog::~CheckpointCatalog() {
  const int rc = sqlite3_close(db_);
  if (rc != SQLITE_OK) PT_LOG(ERROR) << Error(rc, "close").ToString();
}

absl::Status CheckpointCatalog::Error(int rc, const std::string& op) const {
  // A primary-key clash is a checkpoint committed twice.
  const absl::StatusCode code = (rc & 0xff) == SQLITE_CONSTRAINT
                                    ? absl::StatusCode::kAlreadyExists
                                    : SqliteStatusCode(rc);
  return absl::Status(code, absl::StrCat("checkpoint catalog ", db_path_, ": ",
                                         op, ": ", sqlite3_errmsg(db_)));
}

absl::Status CheckpointCatalog::Exec(const char* sql, const std::string& op) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? absl::OkStatus() : Error(rc, op);
}

// WAL + synchronous=FULL: a commit is on disk before Insert returns, so a
// checkpoint reported committed survives a crash (see StateStore).
absl::Status CheckpointCatalog::Setup() {
  int rc = sqlite3_extended_result_codes(db_, 1);
  if (rc == SQLITE_OK) rc = sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  if (rc != SQLITE_OK) return Error(rc, "configure connection");
  {
    Query wal(this, "PRAGMA journal_mode=WAL", "set journal_mode=WAL");
    ASSIGN_OR_RETURN(const bool row, wal.Step());
    if (!row || ColumnText(wal.stmt(), 0) != "wal") {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint catalog ", db_path_, ": cannot use a WAL journal"));
    }
  }
  RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL", "set synchronous=FULL"));
  Query version(this, "PRAGMA user_version", "read user_version");
  ASSIGN_OR_RETURN(const bool row, version.Step());
  const int64_t v = row ? sqlite3_column_int64(version.stmt(), 0) : 0;
  if (v == kSchemaVersion) return absl::OkStatus();
  if (v != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint catalog ", db_path_, ": schema version ", v,
                     " is not the supported version ", kSchemaVersion));
  }
  return InTransaction("create schema", [this] {
    RETURN_IF_ERROR(Exec(kSchemaV1, "create schema"));
    return Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str(),
                "set user_version");
  });
}

absl::Status CheckpointCatalog::InTransaction(
    const std::string& op, const std::function<absl::Status()>& body) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", absl::StrCat(op, ": begin")));
  absl::Status status = body();
  if (status.ok()) status = Exec("COMMIT", absl::StrCat(op, ": commit"));
  // A failed COMMIT (e.g. busy) leaves the transaction open: end it too.
  if (!status.ok() && !sqlite3_get_autocommit(db_)) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  return status;
}

absl::StatusOr<std::vector<int64_t>> CheckpointCatalog::Insert(
    const CheckpointRecord& record, int keep) {
  std::vector<int64_t> deleted;
  RETURN_IF_ERROR(InTransaction("insert checkpoint", [&]() -> absl::Status {
    RETURN_IF_ERROR(InsertRows(record));
    ASSIGN_OR_RETURN(deleted, DeleteOld(record.info.job_id, keep));
    return absl::OkStatus();
  }));
  return deleted;
}

absl::Status CheckpointCatalog::InsertRows(const CheckpointRecord& record) {
  const CheckpointInfo& i = record.info;
  absl::Status status =
      Query(this,
            absl::StrCat("INSERT INTO checkpoints(", kInfoColumns,
                         ", spec_json) VALUES(?,?,?,?,?,?,?,?,?)"),
            "insert checkpoint")
          .Bind(i.job_id)
          .Bind(i.version)
          .Bind(i.step)
          .Bind(i.optimizer_steps)
          .Bind(static_cast<int64_t>(i.num_layers))
          .Bind(i.bytes)
          .Bind(i.created_unix_ms)
          .Bind(i.write_seconds)
          .Bind(record.spec_json)
          .Run();
  if (status.code() == absl::StatusCode::kAlreadyExists) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint v", i.version,
                                                 " of job ", i.job_id,
                                                 " is already committed"));
  }
  RETURN_IF_ERROR(status);
  for (const CheckpointLayerRecord& l : record.layers) {
    RETURN_IF_ERROR(Query(this,
                          "INSERT INTO checkpoint_layers(job_id, version, "
                          "layer, bytes, crc32) VALUES(?,?,?,?,?)",
                          "insert checkpoint layer")
                        .Bind(i.job_id)
                        .Bind(i.version)
                        .Bind(static_cast<int64_t>(l.layer))
                        .Bind(l.bytes)
                        .Bind(static_cast<int64_t>(l.crc32))
                        .Run());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointCatalog::List(
    const std::string& job_id) {
  Query q(
      this,
      absl::StrCat("SELECT ", kInfoColumns,
                   " FROM checkpoints WHERE job_id=? ORDER BY version DESC"),
      "list checkpoints");
  q.Bind(job_id);
  std::vector<CheckpointInfo> out;
  while (true) {
    ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    out.push_back(InfoFromRow(q.stmt()));
  }
  return out;
}

absl::StatusOr<std::optional<CheckpointRecord>> CheckpointCatalog::Get(
    const std::string& job_id, int64_t version) {
  CheckpointRecord record;
  {
    Query q(this,
            absl::StrCat("SELECT ", kInfoColumns,
                         ", spec_json FROM checkpoints"
                         " WHERE job_id=? AND version=?"),
            "get checkpoint");
    q.Bind(job_id).Bind(version);
    ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) return std::nullopt;
    record.info = InfoFromRow(q.stmt());
    record.spec_json = ColumnText(q.stmt(), 8);
  }
  Query q(this,
          "SELECT layer, bytes, crc32 FROM checkpoint_layers WHERE job_id=? "
          "AND version=? ORDER BY layer",
          "get checkpoint layers");
  q.Bind(job_id).Bind(version);
  while (true) {
    ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    CheckpointLayerRecord& l = record.layers.emplace_back();
    l.layer = sqlite3_column_int(q.stmt(), 0);
    l.bytes = sqlite3_column_int64(q.stmt(), 1);
    l.crc32 = static_cast<uint32_t>(sqlite3_column_int64(q.stmt(), 2));
  }
  return record;
}

// Inside the caller's transaction.
absl::StatusOr<std::vector<int64_t>> CheckpointCatalog::DeleteOld(
    const std::string& job_id, int keep) {
  std::vector<int64_t> doomed;
  ASSIGN_OR_RETURN(const std::vector<CheckpointInfo> all, List(job_id));
  for (size_t i = static_cast<size_t>(std::max(keep, 0)); i < all.size(); ++i) {
    doomed.push_back(all[i].version);
  }
  for (const int64_t v : doomed) {
    for (const char* table : {"checkpoints", "checkpoint_layers"}) {
      RETURN_IF_ERROR(Query(this,
                            absl::StrCat("DELETE FROM ", table,
                                         " WHERE job_id=? AND version=?"),
                            "delete old checkpoint")
                          .Bind(job_id)
                          .Bind(v)
                          .Run());
    }
  }
  return doomed;
}

absl::Status CheckpointCatalog::DeleteJob(const std::string& job_id) {
  return InTransaction("delete job checkpoints", [&] {
    for (const char* table : {"checkpoints", "checkpoint_layers"}) {
      RETURN_IF_ERROR(
          Query(this, absl::StrCat("DELETE FROM ", table, " WHERE job_id=?"),
                "delete job checkpoints")
              .Bind(job_id)
              .Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<CheckpointCatalog::Committed>>
CheckpointCatalog::AllCommitted() {
  Query q(this, "SELECT job_id, version, num_layers FROM checkpoints",
          "list all checkpoints");
  std::vector<Committed> out;
  while (true) {
    ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    out.push_back({ColumnText(q.stmt(), 0), sqlite3_column_int64(q.stmt(), 1),
                   sqlite3_column_int(q.stmt(), 2)});
  }
  return out;
}

}  // namespace pipetrain
