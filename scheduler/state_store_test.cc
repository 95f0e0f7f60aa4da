#include "scheduler/state_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::google::protobuf::util::MessageDifferencer;

testing::AssertionResult SameProto(const google::protobuf::Message& got,
                                   const google::protobuf::Message& want) {
  if (MessageDifferencer::Equals(got, want)) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure() << "got:\n"
                                     << got.DebugString() << "want:\n"
                                     << want.DebugString();
}

v1::Job MakeJob(const std::string& id, int64_t created_unix_ms) {
  v1::Job job;
  job.set_id(id);
  job.set_name("name of " + id);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_step(42);
  job.set_total_steps(1000);
  job.set_loss(0.25);
  job.set_created_unix_ms(created_unix_ms);
  job.set_committed_version(41);
  (*job.mutable_spec()->mutable_worker_selector())["zone"] = "edge";
  job.mutable_spec()->set_num_stages(2);
  v1::StageProgress* stage = job.add_stages();
  stage->set_stage(1);
  stage->set_worker_id("w-1");
  stage->set_busy_fraction(0.75);
  job.mutable_eval()->set_accuracy(0.5);
  return job;
}

v1::WorkerInfo MakeWorker(const std::string& id) {
  v1::WorkerInfo worker;
  worker.set_id(id);
  worker.set_address("10.0.0.1:7000");
  worker.set_device_kind("cuda");
  worker.set_memory_bytes(int64_t{80} << 30);
  worker.set_gemm_gflops(51234.5);
  (*worker.mutable_labels())["zone"] = "cloud";
  (*worker.mutable_labels())["rack"] = "r7";
  worker.set_state(v1::WORKER_STATE_ASSIGNED);
  worker.set_job_id("job-1");
  worker.set_stage(3);
  worker.set_last_heartbeat_unix_ms(1700000000123);
  return worker;
}

v1::Plan MakePlan(const std::string& job_id) {
  v1::Plan plan;
  plan.set_job_id(job_id);
  for (int s = 0; s < 2; ++s) {
    v1::PlannedStage* stage = plan.add_stages();
    stage->set_stage(s);
    stage->set_layer_begin(s * 4);
    stage->set_layer_end(s * 4 + 4);
    stage->set_worker_id(absl::StrCat("w-", s));
    stage->set_compute_seconds(0.01 * (s + 1));
  }
  plan.set_bottleneck_stage(1);
  plan.set_explanation("stage 1 is the slowest");
  return plan;
}

v1::VersionEntry MakeEntry(int32_t stage, int64_t step, int64_t version) {
  v1::VersionEntry entry;
  entry.set_stage(stage);
  entry.set_step(step);
  entry.set_weight_version(version);
  entry.set_unix_ms(1700000000000 + step * 10 + stage);
  return entry;
}

// Runs one SQL statement on the database file with a connection of its own,
// to reach behind the store's back.
void RawExec(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error == nullptr ? "" : error);
  sqlite3_free(error);
  sqlite3_close(db);
}

// The first column of the first row of `sql`, as text.
std::string RawQuery(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string result = "<error>";
  if (sqlite3_open(db_path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      result = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return result;
}

class StateStoreTest : public testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/pt_state_store_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr) << std::strerror(errno);
    root_ = pattern;
    data_dir_ = root_ + "/data";
    db_path_ = data_dir_ + "/scheduler.db";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::unique_ptr<StateStore> OpenOrDie() {
    auto store = StateStore::Open(data_dir_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  std::string root_;
  std::string data_dir_;
  std::string db_path_;
};

TEST_F(StateStoreTest, RoundTripsEveryRecordType) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  const v1::Job job = MakeJob("job-1", 1000);
  const v1::WorkerInfo worker = MakeWorker("w-1");
  const v1::Plan plan = MakePlan("job-1");
  ASSERT_TRUE(store->PutJob(job).ok());
  ASSERT_TRUE(store->PutWorker(worker).ok());
  ASSERT_TRUE(store->PutPlan(plan).ok());
  ASSERT_TRUE(store->AppendVersions("job-1", {MakeEntry(0, 5, 6)}).ok());
  ASSERT_TRUE(store->PutMeta("next_job", "2").ok());

  auto jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_TRUE(SameProto((*jobs)[0], job));
  auto workers = store->LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_TRUE(SameProto((*workers)[0], worker));
  auto loaded_plan = store->LoadPlan("job-1");
  ASSERT_TRUE(loaded_plan.ok()) << loaded_plan.status();
  ASSERT_TRUE(loaded_plan->has_value());
  EXPECT_TRUE(SameProto(**loaded_plan, plan));
  auto versions = store->LoadVersions("job-1", 0);
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 1u);
  EXPECT_TRUE(SameProto((*versions)[0], MakeEntry(0, 5, 6)));

  auto no_plan = store->LoadPlan("job-2");
  ASSERT_TRUE(no_plan.ok()) << no_plan.status();
  EXPECT_FALSE(no_plan->has_value());
}

TEST_F(StateStoreTest, CreatesMissingDataDirectories) {
  data_dir_ = root_ + "/a/b/c";
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(std::filesystem::is_regular_file(data_dir_ + "/scheduler.db"));
}

TEST_F(StateStoreTest, ReopenAfterCloseKeepsEverything) {
  {
    auto store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->PutJob(MakeJob("job-1", 1)).ok());
    ASSERT_TRUE(store->PutJob(MakeJob("job-2", 2)).ok());
    ASSERT_TRUE(store->PutWorker(MakeWorker("w-1")).ok());
    ASSERT_TRUE(store->PutPlan(MakePlan("job-1")).ok());
    ASSERT_TRUE(
        store->AppendVersions("job-1", {MakeEntry(0, 1, 1), MakeEntry(1, 1, 1)})
            .ok());
    ASSERT_TRUE(store->PutMeta("next_job", "3").ok());
  }
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  auto jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_TRUE(SameProto((*jobs)[0], MakeJob("job-1", 1)));
  EXPECT_TRUE(SameProto((*jobs)[1], MakeJob("job-2", 2)));
  auto workers = store->LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_TRUE(SameProto((*workers)[0], MakeWorker("w-1")));
  auto plan = store->LoadPlan("job-1");
  ASSERT_TRUE(plan.ok() && plan->has_value());
  EXPECT_TRUE(SameProto(**plan, MakePlan("job-1")));
  auto versions = store->LoadVersions("job-1", 0);
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(versions->size(), 2u);
  auto meta = store->GetMeta("next_job");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->value_or("<missing>"), "3");
}

TEST_F(StateStoreTest, SchemaIsVersionedAndJournalIsWriteAhead) {
  ASSERT_NE(OpenOrDie(), nullptr);
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"), "1");
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawQuery(db_path_,
                     "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                     "sqlite_schema WHERE type='table' ORDER BY name)"),
            "jobs,meta,plans,versions,workers");
}

TEST_F(StateStoreTest, RefusesANewerSchemaVersion) {
  ASSERT_NE(OpenOrDie(), nullptr);
  RawExec(db_path_, "PRAGMA user_version=2");
  auto store = StateStore::Open(data_dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Reads exactly `size` bytes; false at end of stream.
bool ReadFull(int fd, void* buf, size_t size) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A child writes jobs and acknowledges each after PutJob returned; it is
// SIGKILLed mid-stream. Every acknowledged job must be in the store.
TEST_F(StateStoreTest, SigkilledWriterLosesNothingAcknowledged) {
  constexpr int kKillAfterAcks = 100;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // child: no gtest macros, leave with _exit only
    close(fds[0]);
    auto store = StateStore::Open(data_dir_);
    if (!store.ok()) _exit(2);
    for (int32_t i = 0; i < 1000000; ++i) {
      if (!(*store)->PutJob(MakeJob(absl::StrCat("job-", i), i)).ok()) {
        _exit(3);
      }
      if (write(fds[1], &i, sizeof(i)) != sizeof(i)) _exit(4);
    }
    _exit(0);
  }
  close(fds[1]);
  std::vector<int32_t> acked;
  int32_t i;
  while (ReadFull(fds[0], &i, sizeof(i))) {
    acked.push_back(i);
    if (acked.size() == kKillAfterAcks) kill(pid, SIGKILL);
  }
  close(fds[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "child ended otherwise, status " << wstatus;
  ASSERT_GE(acked.size(), static_cast<size_t>(kKillAfterAcks));

  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  auto jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::set<std::string> stored;
  for (const v1::Job& job : *jobs) stored.insert(job.id());
  for (int32_t n : acked) {
    EXPECT_EQ(stored.count(absl::StrCat("job-", n)), 1u)
        << "acknowledged job-" << n << " is lost";
  }
  ASSERT_GE(jobs->size(), acked.size());
  EXPECT_TRUE(
      SameProto((*jobs)[acked.size() - 1],
                MakeJob(absl::StrCat("job-", acked.back()), acked.back())));
}

TEST_F(StateStoreTest, PutJobReplacesByIdAndLoadsByCreation) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  // Creation order differs from both id order and insertion order.
  ASSERT_TRUE(store->PutJob(MakeJob("job-a", 20)).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("job-b", 30)).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("job-c", 10)).ok());
  v1::Job updated = MakeJob("job-a", 20);
  updated.set_state(v1::JOB_STATE_COMPLETED);
  updated.set_step(1000);
  ASSERT_TRUE(store->PutJob(updated).ok());

  auto jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[0].id(), "job-c");
  EXPECT_TRUE(SameProto((*jobs)[1], updated));
  EXPECT_EQ((*jobs)[2].id(), "job-b");
}

TEST_F(StateStoreTest, PutRecordsWithoutIdIsInvalidArgument) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->PutJob(v1::Job()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutWorker(v1::WorkerInfo()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutPlan(v1::Plan()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StateStoreTest, LoadVersionsFiltersBySinceStepOrdersByStepThenStage) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  // Shuffled, in two appends, with another job's entries in between.
  ASSERT_TRUE(
      store
          ->AppendVersions("job-1", {MakeEntry(1, 3, 3), MakeEntry(0, 1, 1),
                                     MakeEntry(1, 2, 2)})
          .ok());
  ASSERT_TRUE(store->AppendVersions("job-2", {MakeEntry(0, 2, 9)}).ok());
  ASSERT_TRUE(
      store
          ->AppendVersions("job-1", {MakeEntry(0, 3, 3), MakeEntry(1, 1, 1),
                                     MakeEntry(0, 2, 2)})
          .ok());
  // Replaces (job-1, stage 0, step 2).
  ASSERT_TRUE(store->AppendVersions("job-1", {MakeEntry(0, 2, 7)}).ok());
  ASSERT_TRUE(store->AppendVersions("job-1", {}).ok());

  auto versions = store->LoadVersions("job-1", 2);
  ASSERT_TRUE(versions.ok()) << versions.status();
  const std::vector<v1::VersionEntry> want = {
      MakeEntry(0, 2, 7), MakeEntry(1, 2, 2), MakeEntry(0, 3, 3),
      MakeEntry(1, 3, 3)};
  ASSERT_EQ(versions->size(), want.size());
  for (size_t n = 0; n < want.size(); ++n) {
    EXPECT_TRUE(SameProto((*versions)[n], want[n])) << "entry " << n;
  }
  auto all = store->LoadVersions("job-1", 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 6u);
  auto none = store->LoadVersions("job-1", 4);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  auto unknown = store->LoadVersions("job-3", 0);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_TRUE(unknown->empty());
}

TEST_F(StateStoreTest, DataDirUnderARegularFileFailsNamingThePath) {
  const std::string file = root_ + "/plain_file";
  std::ofstream(file) << "not a directory";
  data_dir_ = file + "/data";
  auto store = StateStore::Open(data_dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find(data_dir_), absl::string_view::npos)
      << store.status();
}

TEST_F(StateStoreTest, FileThatIsNotADatabaseFailsNamingThePath) {
  std::filesystem::create_directories(data_dir_);
  {
    std::ofstream out(db_path_, std::ios::binary);
    for (int n = 0; n < 512; ++n) out << "garbage, not sqlite! ";
  }
  auto store = StateStore::Open(data_dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(store.status().code() == absl::StatusCode::kDataLoss ||
              store.status().code() == absl::StatusCode::kUnavailable)
      << store.status();
  EXPECT_NE(store.status().message().find(db_path_), absl::string_view::npos)
      << store.status();
}

TEST_F(StateStoreTest, RecordThatDoesNotParseIsDataLossNamingTableAndKey) {
  {
    auto store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->PutJob(MakeJob("job-7", 1)).ok());
    ASSERT_TRUE(store->PutPlan(MakePlan("job-7")).ok());
  }
  // Field 1, length 5, but only one byte follows.
  RawExec(db_path_, "UPDATE jobs SET record=x'0a0561' WHERE id='job-7'");
  RawExec(db_path_, "UPDATE plans SET record=x'0a0561' WHERE job_id='job-7'");
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  auto jobs = store->LoadJobs();
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(jobs.status().message().find("jobs"), absl::string_view::npos);
  EXPECT_NE(jobs.status().message().find("job-7"), absl::string_view::npos)
      << jobs.status();
  auto plan = store->LoadPlan("job-7");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("plans"), absl::string_view::npos)
      << plan.status();
}

TEST_F(StateStoreTest, MetaGetAndPut) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  auto missing = store->GetMeta("next_job");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  ASSERT_TRUE(store->PutMeta("next_job", "7").ok());
  ASSERT_TRUE(store->PutMeta("empty", "").ok());
  ASSERT_TRUE(store->PutMeta("next_job", "8").ok());
  auto value = store->GetMeta("next_job");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->value_or("<missing>"), "8");
  auto empty = store->GetMeta("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->value_or("<missing>"), "");
}

TEST_F(StateStoreTest, ConcurrentCallersFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kJobsPerThread = 10;
  constexpr int kReadsPerThread = 2000;
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = absl::StrCat("key-", t);
      const std::string value = absl::StrCat("value-", t);
      if (!store->PutMeta(key, value).ok()) ++failures[t];
      for (int n = 0; n < kJobsPerThread; ++n) {
        const std::string id = absl::StrCat("job-", t, "-", n);
        if (!store->PutJob(MakeJob(id, n)).ok()) ++failures[t];
        if (!store->AppendVersions(id, {MakeEntry(t, n, n)}).ok()) {
          ++failures[t];
        }
      }
      // Reads share prepared statements: each must see its own bindings.
      for (int n = 0; n < kReadsPerThread; ++n) {
        auto got = store->GetMeta(key);
        if (!got.ok() || got->value_or("") != value) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << t;
  auto jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), static_cast<size_t>(kThreads * kJobsPerThread));
}

}  // namespace
}  // namespace pipetrain
