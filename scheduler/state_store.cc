#include "scheduler/state_store.h"

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/sqlite_status.h"

namespace pipetrain {
namespace {

constexpr int kSchemaVersion = 1;
constexpr int kBusyTimeoutMs = 5000;
constexpr char kDbFileName[] = "scheduler.db";

// Version 1. Records are serialized protos; the other columns are only what
// rows are looked up or ordered by.
constexpr char kSchemaV1[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    "  id TEXT PRIMARY KEY, created_unix_ms INTEGER, record BLOB);"
    "CREATE TABLE IF NOT EXISTS workers(id TEXT PRIMARY KEY, record BLOB);"
    "CREATE TABLE IF NOT EXISTS plans(job_id TEXT PRIMARY KEY, record BLOB);"
    "CREATE TABLE IF NOT EXISTS versions("
    "  job_id TEXT, stage INTEGER, step INTEGER, weight_version INTEGER,"
    "  unix_ms INTEGER, PRIMARY KEY(job_id, stage, step));"
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);";

struct StatementDeleter {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using Statement = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

// Resets a shared prepared statement when a call is done with it, so the
// next call starts clean and no read transaction stays open.
class StatementUse {
 public:
  explicit StatementUse(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~StatementUse() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  StatementUse(const StatementUse&) = delete;
  StatementUse& operator=(const StatementUse&) = delete;
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_;
};

absl::Status CreateDataDir(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  // An existing non-directory at `data_dir` is not always reported above.
  // (The error_code overloads: std::filesystem must not throw here.)
  std::error_code stat_ec;
  if (!ec && !std::filesystem::is_directory(data_dir, stat_ec)) {
    ec = stat_ec ? stat_ec : std::make_error_code(std::errc::not_a_directory);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("StateStore: cannot create data directory ", data_dir,
                     ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

// Thread-safe: every public method takes mu_ for its whole duration, so
// the connection (and sqlite3_errmsg, which is per connection) is only ever
// used by one thread at a time.
class StateStore::Impl {
 public:
  static absl::StatusOr<std::unique_ptr<Impl>> Open(std::string db_path);
  ~Impl();

  absl::Status PutJob(const v1::Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<v1::Job>> LoadJobs() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutWorker(const v1::WorkerInfo& worker) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeleteWorker(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<v1::WorkerInfo>> LoadWorkers()
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutPlan(const v1::Plan& plan) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<v1::Plan>> LoadPlan(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AppendVersions(const std::string& job_id,
                              const std::vector<v1::VersionEntry>& entries)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<v1::VersionEntry>> LoadVersions(
      const std::string& job_id, int64_t since_step) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutMeta(const std::string& key, const std::string& value)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<std::string>> GetMeta(const std::string& key)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Statements {
    Statement begin, commit, rollback;
    Statement put_job, load_jobs;
    Statement put_worker, load_workers, delete_worker;
    Statement put_plan, load_plan;
    Statement put_version, load_versions;
    Statement put_meta, get_meta;
  };

  Impl(std::string db_path, sqlite3* db)
      : db_path_(std::move(db_path)), db_(db) {}

  absl::Status Error(int rc, absl::string_view op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Configure() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PrepareAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Prepare(const char* sql, Statement* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> QueryInt(const char* sql, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a statement that returns no rows (its bindings already set).
  absl::Status StepDone(sqlite3_stmt* stmt, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BindText(sqlite3_stmt* stmt, int index, absl::string_view text,
                        absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BindBlob(sqlite3_stmt* stmt, int index, absl::string_view blob,
                        absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BindInt(sqlite3_stmt* stmt, int index, int64_t value,
                       absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INSERT-or-update of (key, record) through `stmt`.
  absl::Status PutRecord(sqlite3_stmt* stmt, absl::string_view key,
                         const google::protobuf::MessageLite& record,
                         absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Steps `stmt` and parses column `record_column` of every row into a T.
  template <typename T>
  absl::StatusOr<std::vector<T>> LoadRecords(sqlite3_stmt* stmt,
                                             const char* table,
                                             absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendVersionsLocked(
      const std::string& job_id, const std::vector<v1::VersionEntry>& entries)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::string db_path_;

  mutable absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_) = nullptr;
  Statements stmts_ ABSL_GUARDED_BY(mu_);
};

absl::Status StateStore::Impl::Error(int rc, absl::string_view op) const {
  return absl::Status(SqliteStatusCode(rc),
                      absl::StrCat("StateStore ", db_path_, ": ", op, ": ",
                                   sqlite3_errmsg(db_)));
}

absl::StatusOr<std::unique_ptr<StateStore::Impl>> StateStore::Impl::Open(
    std::string db_path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      db_path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  // The handle owns the connection even when opening failed.
  std::unique_ptr<Impl> impl(new Impl(std::move(db_path), db));
  absl::MutexLock lock(&impl->mu_);
  if (db == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("StateStore ", impl->db_path_, ": open: out of memory"));
  }
  if (rc != SQLITE_OK) return impl->Error(rc, "open");
  RETURN_IF_ERROR(impl->Configure());
  RETURN_IF_ERROR(impl->Migrate());
  RETURN_IF_ERROR(impl->PrepareAll());
  return impl;
}

StateStore::Impl::~Impl() {
  absl::MutexLock lock(&mu_);
  stmts_ = Statements();  // finalize before closing
  const int rc = sqlite3_close(db_);
  if (rc != SQLITE_OK) {
    PT_LOG(ERROR) << Error(rc, "close").ToString();
  }
}

absl::Status StateStore::Impl::Configure() {
  int rc = sqlite3_extended_result_codes(db_, 1);
  if (rc == SQLITE_OK) rc = sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  if (rc != SQLITE_OK) return Error(rc, "configure connection");
  // The first statement that reads the file: a file that is not a database
  // fails here with SQLITE_NOTADB.
  Statement wal;
  RETURN_IF_ERROR(Prepare("PRAGMA journal_mode=WAL", &wal));
  rc = sqlite3_step(wal.get());
  if (rc != SQLITE_ROW) return Error(rc, "set journal_mode=WAL");
  const auto* mode =
      reinterpret_cast<const char*>(sqlite3_column_text(wal.get(), 0));
  if (mode == nullptr || absl::string_view(mode) != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat("StateStore ", db_path_, ": journal_mode is ",
                     mode == nullptr ? "unknown" : mode,
                     ", not wal (does the filesystem support it?)"));
  }
  // FULL: a commit is on disk (WAL fsynced) before the call that made it
  // returns, so nothing acknowledged is lost to a crash.
  return Exec("PRAGMA synchronous=FULL", "set synchronous=FULL");
}

absl::Status StateStore::Impl::Migrate() {
  ASSIGN_OR_RETURN(const int64_t version,
                   QueryInt("PRAGMA user_version", "read user_version"));
  if (version == kSchemaVersion) return absl::OkStatus();
  if (version != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("StateStore ", db_path_, ": schema version ", version,
                     " is not the supported version ", kSchemaVersion));
  }
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "begin schema creation"));
  absl::Status status = Exec(kSchemaV1, "create schema");
  if (status.ok()) {
    status = Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str(),
                  "set user_version");
  }
  if (status.ok()) status = Exec("COMMIT", "commit schema creation");
  if (!status.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return status;
}

absl::Status StateStore::Impl::PrepareAll() {
  Statements& s = stmts_;
  RETURN_IF_ERROR(Prepare("BEGIN IMMEDIATE", &s.begin));
  RETURN_IF_ERROR(Prepare("COMMIT", &s.commit));
  RETURN_IF_ERROR(Prepare("ROLLBACK", &s.rollback));
  // Upserts keep the rowid of a replaced row, so LoadJobs' tie-break on
  // rowid is the order in which jobs were first stored.
  RETURN_IF_ERROR(Prepare(
      "INSERT INTO jobs(id, created_unix_ms, record) VALUES(?1, ?3, ?2) "
      "ON CONFLICT(id) DO UPDATE SET created_unix_ms=excluded.created_unix_ms,"
      " record=excluded.record",
      &s.put_job));
  RETURN_IF_ERROR(
      Prepare("SELECT id, record FROM jobs ORDER BY created_unix_ms, rowid",
              &s.load_jobs));
  RETURN_IF_ERROR(
      Prepare("INSERT INTO workers(id, record) VALUES(?1, ?2) "
              "ON CONFLICT(id) DO UPDATE SET record=excluded.record",
              &s.put_worker));
  RETURN_IF_ERROR(
      Prepare("SELECT id, record FROM workers ORDER BY id", &s.load_workers));
  RETURN_IF_ERROR(Prepare("DELETE FROM workers WHERE id=?1", &s.delete_worker));
  RETURN_IF_ERROR(
      Prepare("INSERT INTO plans(job_id, record) VALUES(?1, ?2) "
              "ON CONFLICT(job_id) DO UPDATE SET record=excluded.record",
              &s.put_plan));
  RETURN_IF_ERROR(Prepare("SELECT job_id, record FROM plans WHERE job_id=?1",
                          &s.load_plan));
  RETURN_IF_ERROR(Prepare(
      "INSERT OR REPLACE INTO versions(job_id, stage, step, weight_version,"
      " unix_ms) VALUES(?1, ?2, ?3, ?4, ?5)",
      &s.put_version));
  RETURN_IF_ERROR(
      Prepare("SELECT stage, step, weight_version, unix_ms FROM versions "
              "WHERE job_id=?1 AND step>=?2 ORDER BY step, stage",
              &s.load_versions));
  RETURN_IF_ERROR(Prepare(
      "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)", &s.put_meta));
  return Prepare("SELECT value FROM meta WHERE key=?1", &s.get_meta);
}

absl::Status StateStore::Impl::Exec(const char* sql, absl::string_view op) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? absl::OkStatus() : Error(rc, op);
}

absl::Status StateStore::Impl::Prepare(const char* sql, Statement* out) {
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr);
  out->reset(stmt);
  if (rc != SQLITE_OK) return Error(rc, absl::StrCat("prepare ", sql));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StateStore::Impl::QueryInt(const char* sql,
                                                   absl::string_view op) {
  Statement stmt;
  RETURN_IF_ERROR(Prepare(sql, &stmt));
  const int rc = sqlite3_step(stmt.get());
  if (rc != SQLITE_ROW) return Error(rc, op);
  return sqlite3_column_int64(stmt.get(), 0);
}

absl::Status StateStore::Impl::StepDone(sqlite3_stmt* stmt,
                                        absl::string_view op) {
  const int rc = sqlite3_step(stmt);
  return rc == SQLITE_DONE ? absl::OkStatus() : Error(rc, op);
}

absl::Status StateStore::Impl::BindText(sqlite3_stmt* stmt, int index,
                                        absl::string_view text,
                                        absl::string_view op) {
  // SQLITE_STATIC: the caller's string outlives the statement's use.
  const int rc = sqlite3_bind_text64(stmt, index, text.data(), text.size(),
                                     SQLITE_STATIC, SQLITE_UTF8);
  return rc == SQLITE_OK ? absl::OkStatus() : Error(rc, op);
}

absl::Status StateStore::Impl::BindBlob(sqlite3_stmt* stmt, int index,
                                        absl::string_view blob,
                                        absl::string_view op) {
  const int rc =
      sqlite3_bind_blob64(stmt, index, blob.data(), blob.size(), SQLITE_STATIC);
  return rc == SQLITE_OK ? absl::OkStatus() : Error(rc, op);
}

absl::Status StateStore::Impl::BindInt(sqlite3_stmt* stmt, int index,
                                       int64_t value, absl::string_view op) {
  const int rc = sqlite3_bind_int64(stmt, index, value);
  return rc == SQLITE_OK ? absl::OkStatus() : Error(rc, op);
}

absl::Status StateStore::Impl::PutRecord(
    sqlite3_stmt* stmt, absl::string_view key,
    const google::protobuf::MessageLite& record, absl::string_view op) {
  const std::string bytes = record.SerializeAsString();
  RETURN_IF_ERROR(BindText(stmt, 1, key, op));
  RETURN_IF_ERROR(BindBlob(stmt, 2, bytes, op));
  return StepDone(stmt, op);
}

template <typename T>
absl::StatusOr<std::vector<T>> StateStore::Impl::LoadRecords(
    sqlite3_stmt* stmt, const char* table, absl::string_view op) {
  std::vector<T> records;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const void* data = sqlite3_column_blob(stmt, 1);
    const int size = sqlite3_column_bytes(stmt, 1);
    T& record = records.emplace_back();
    if (size > 0 && !record.ParseFromArray(data, size)) {
      const auto* key =
          reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      return absl::DataLossError(
          absl::StrCat("StateStore ", db_path_, ": ", op, ": the record of ",
                       table, " key '", key == nullptr ? "" : key,
                       "' does not parse as ", record.GetTypeName()));
    }
  }
  if (rc != SQLITE_DONE) return Error(rc, op);
  return records;
}

absl::Status StateStore::Impl::PutJob(const v1::Job& job) {
  if (job.id().empty()) {
    return absl::InvalidArgumentError("StateStore: PutJob: job has no id");
  }
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.put_job.get());
  RETURN_IF_ERROR(BindInt(use.get(), 3, job.created_unix_ms(), "PutJob"));
  return PutRecord(use.get(), job.id(), job, "PutJob");
}

absl::StatusOr<std::vector<v1::Job>> StateStore::Impl::LoadJobs() {
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.load_jobs.get());
  return LoadRecords<v1::Job>(use.get(), "jobs", "LoadJobs");
}

absl::Status StateStore::Impl::PutWorker(const v1::WorkerInfo& worker) {
  if (worker.id().empty()) {
    return absl::InvalidArgumentError(
        "StateStore: PutWorker: worker has no id");
  }
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.put_worker.get());
  return PutRecord(use.get(), worker.id(), worker, "PutWorker");
}

absl::Status StateStore::Impl::DeleteWorker(const std::string& id) {
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.delete_worker.get());
  RETURN_IF_ERROR(BindText(use.get(), 1, id, "DeleteWorker"));
  return StepDone(use.get(), "DeleteWorker");
}

absl::StatusOr<std::vector<v1::WorkerInfo>> StateStore::Impl::LoadWorkers() {
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.load_workers.get());
  return LoadRecords<v1::WorkerInfo>(use.get(), "workers", "LoadWorkers");
}

absl::Status StateStore::Impl::PutPlan(const v1::Plan& plan) {
  if (plan.job_id().empty()) {
    return absl::InvalidArgumentError(
        "StateStore: PutPlan: plan has no job_id");
  }
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.put_plan.get());
  return PutRecord(use.get(), plan.job_id(), plan, "PutPlan");
}

absl::StatusOr<std::optional<v1::Plan>> StateStore::Impl::LoadPlan(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.load_plan.get());
  RETURN_IF_ERROR(BindText(use.get(), 1, job_id, "LoadPlan"));
  ASSIGN_OR_RETURN(std::vector<v1::Plan> plans,
                   LoadRecords<v1::Plan>(use.get(), "plans", "LoadPlan"));
  if (plans.empty()) return std::nullopt;
  return std::move(plans.front());
}

absl::Status StateStore::Impl::AppendVersions(
    const std::string& job_id, const std::vector<v1::VersionEntry>& entries) {
  if (entries.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  {
    StatementUse begin(stmts_.begin.get());
    RETURN_IF_ERROR(StepDone(begin.get(), "AppendVersions: begin"));
  }
  absl::Status status = AppendVersionsLocked(job_id, entries);
  if (status.ok()) {
    StatementUse commit(stmts_.commit.get());
    status = StepDone(commit.get(), "AppendVersions: commit");
  }
  // A failed COMMIT (e.g. busy) leaves the transaction open: end it too.
  if (!status.ok() && !sqlite3_get_autocommit(db_)) {
    StatementUse rollback(stmts_.rollback.get());
    sqlite3_step(rollback.get());
  }
  return status;
}

absl::Status StateStore::Impl::AppendVersionsLocked(
    const std::string& job_id, const std::vector<v1::VersionEntry>& entries) {
  constexpr absl::string_view kOp = "AppendVersions";
  for (const v1::VersionEntry& e : entries) {
    StatementUse use(stmts_.put_version.get());
    sqlite3_stmt* stmt = use.get();
    RETURN_IF_ERROR(BindText(stmt, 1, job_id, kOp));
    RETURN_IF_ERROR(BindInt(stmt, 2, e.stage(), kOp));
    RETURN_IF_ERROR(BindInt(stmt, 3, e.step(), kOp));
    RETURN_IF_ERROR(BindInt(stmt, 4, e.weight_version(), kOp));
    RETURN_IF_ERROR(BindInt(stmt, 5, e.unix_ms(), kOp));
    RETURN_IF_ERROR(StepDone(stmt, kOp));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::VersionEntry>> StateStore::Impl::LoadVersions(
    const std::string& job_id, int64_t since_step) {
  constexpr absl::string_view kOp = "LoadVersions";
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.load_versions.get());
  sqlite3_stmt* stmt = use.get();
  RETURN_IF_ERROR(BindText(stmt, 1, job_id, kOp));
  RETURN_IF_ERROR(BindInt(stmt, 2, since_step, kOp));
  std::vector<v1::VersionEntry> entries;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    v1::VersionEntry& e = entries.emplace_back();
    e.set_stage(static_cast<int32_t>(sqlite3_column_int64(stmt, 0)));
    e.set_step(sqlite3_column_int64(stmt, 1));
    e.set_weight_version(sqlite3_column_int64(stmt, 2));
    e.set_unix_ms(sqlite3_column_int64(stmt, 3));
  }
  if (rc != SQLITE_DONE) return Error(rc, kOp);
  return entries;
}

absl::Status StateStore::Impl::PutMeta(const std::string& key,
                                       const std::string& value) {
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.put_meta.get());
  RETURN_IF_ERROR(BindText(use.get(), 1, key, "PutMeta"));
  RETURN_IF_ERROR(BindText(use.get(), 2, value, "PutMeta"));
  return StepDone(use.get(), "PutMeta");
}

absl::StatusOr<std::optional<std::string>> StateStore::Impl::GetMeta(
    const std::string& key) {
  absl::MutexLock lock(&mu_);
  StatementUse use(stmts_.get_meta.get());
  RETURN_IF_ERROR(BindText(use.get(), 1, key, "GetMeta"));
  const int rc = sqlite3_step(use.get());
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) return Error(rc, "GetMeta");
  const auto* text =
      reinterpret_cast<const char*>(sqlite3_column_text(use.get(), 0));
  const int size = sqlite3_column_bytes(use.get(), 0);
  return std::string(text == nullptr ? "" : text, static_cast<size_t>(size));
}

// ---- StateStore: forwards to Impl ----

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(
    const std::string& data_dir) {
  RETURN_IF_ERROR(CreateDataDir(data_dir));
  const std::string db_path =
      (std::filesystem::path(data_dir) / kDbFileName).string();
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Open(db_path));
  return std::unique_ptr<StateStore>(new StateStore(std::move(impl)));
}

StateStore::StateStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateStore::~StateStore() = default;

absl::Status StateStore::PutJob(const v1::Job& job) {
  return impl_->PutJob(job);
}
absl::StatusOr<std::vector<v1::Job>> StateStore::LoadJobs() const {
  return impl_->LoadJobs();
}
absl::Status StateStore::PutWorker(const v1::WorkerInfo& worker) {
  return impl_->PutWorker(worker);
}
absl::Status StateStore::DeleteWorker(const std::string& id) {
  return impl_->DeleteWorker(id);
}
absl::StatusOr<std::vector<v1::WorkerInfo>> StateStore::LoadWorkers() const {
  return impl_->LoadWorkers();
}
absl::Status StateStore::PutPlan(const v1::Plan& plan) {
  return impl_->PutPlan(plan);
}
absl::StatusOr<std::optional<v1::Plan>> StateStore::LoadPlan(
    const std::string& job_id) const {
  return impl_->LoadPlan(job_id);
}
absl::Status StateStore::AppendVersions(
    const std::string& job_id, const std::vector<v1::VersionEntry>& entries) {
  return impl_->AppendVersions(job_id, entries);
}
absl::StatusOr<std::vector<v1::VersionEntry>> StateStore::LoadVersions(
    const std::string& job_id, int64_t since_step) const {
  return impl_->LoadVersions(job_id, since_step);
}
absl::Status StateStore::PutMeta(const std::string& key,
                                 const std::string& value) {
  return impl_->PutMeta(key, value);
}
absl::StatusOr<std::optional<std::string>> StateStore::GetMeta(
    const std::string& key) const {
  return impl_->GetMeta(key);
}

}  // namespace pipetrain
