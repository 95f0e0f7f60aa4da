#include "scheduler/state_writer.h"

#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "common/temp_dir_for_test.h"
#include "gtest/gtest.h"
#include "scheduler/state_store.h"

namespace pipetrain {
namespace {

using TempDir = ScopedTempDir;

v1::Job JobIn(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  return job;
}

v1::VersionEntry Entry(int stage, int64_t step) {
  v1::VersionEntry e;
  e.set_stage(stage);
  e.set_step(step);
  e.set_weight_version(step + 1);
  return e;
}

TEST(StateWriterTest, NothingIsWrittenUntilAFlushAndTheNewestRecordWins) {
  TempDir dir;
  auto store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  StateWriter writer(store->get());
  writer.PutJob(JobIn("job-1", v1::JOB_STATE_PENDING));
  writer.PutJob(JobIn("job-1", v1::JOB_STATE_RUNNING));
  v1::WorkerInfo w;
  w.set_id("w-1");
  w.set_address("a:1");
  writer.PutWorker(w);
  v1::Plan plan;
  plan.set_job_id("job-1");
  writer.PutPlan(plan);
  writer.AppendVersions("job-1", {Entry(0, 0), Entry(1, 0)});
  writer.AppendVersions("job-1", {Entry(0, 1)});
  EXPECT_EQ(writer.pending(), 6u);
  EXPECT_TRUE((*store)->LoadJobs()->empty());

  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(writer.pending(), 0u);
  auto jobs = (*store)->LoadJobs();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*store)->LoadWorkers()->size(), 1u);
  EXPECT_TRUE((*store)->LoadPlan("job-1")->has_value());
  EXPECT_EQ((*store)->LoadVersions("job-1", 0)->size(), 3u);
}

TEST(StateWriterTest, WithoutAStoreEverythingIsDropped) {
  StateWriter writer(nullptr);
  writer.PutJob(JobIn("job-1", v1::JOB_STATE_PENDING));
  writer.AppendVersions("job-1", {Entry(0, 0)});
  EXPECT_EQ(writer.pending(), 0u);
  EXPECT_TRUE(writer.Flush().ok());
  // Nothing kept, nothing to wait for.
  EXPECT_EQ(writer.queued_sequence(), 0u);
  EXPECT_EQ(writer.durable_sequence(), 0u);
}

// Workers repeat results until their record is durable (ReportCursor): a
// record counts as written only once a flush wrote it and every record
// queued before it.
TEST(StateWriterTest, ARecordIsDurableOnceItAndEveryEarlierOneIsWritten) {
  TempDir dir;
  auto store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  StateWriter writer(store->get());
  writer.AppendVersions("job-1", {Entry(0, 0)});
  EXPECT_EQ(writer.queued_sequence(), 1u);
  EXPECT_EQ(writer.durable_sequence(), 0u);
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(writer.durable_sequence(), 1u);

  writer.AppendVersions("job-1", {Entry(0, 1)});
  writer.PutJob(JobIn("", v1::JOB_STATE_RUNNING));  // cannot be stored
  writer.AppendVersions("job-1", {Entry(0, 2)});
  EXPECT_EQ(writer.queued_sequence(), 4u);
  EXPECT_FALSE(writer.Flush().ok());
  // Steps 1 and 2 are on disk, but record 3 is not, so neither counts.
  EXPECT_EQ((*store)->LoadVersions("job-1", 0)->size(), 3u);
  EXPECT_EQ(writer.durable_sequence(), 1u);
}

TEST(StateWriterTest, AFailedWriteStaysQueuedBehindNewerRecords) {
  TempDir dir;
  auto store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  StateWriter writer(store->get());
  // A job without an id cannot be stored (InvalidArgument).
  writer.PutJob(JobIn("", v1::JOB_STATE_RUNNING));
  writer.PutJob(JobIn("job-2", v1::JOB_STATE_RUNNING));
  const absl::Status status = writer.Flush();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ((*store)->LoadJobs()->size(), 1u);
  EXPECT_EQ(writer.pending(), 1u);  // retried by the next flush
}

TEST(StateWriterTest, QueueingFromManyThreadsWhileFlushingLosesNothing) {
  TempDir dir;
  auto store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  StateWriter writer(store->get());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&writer, t] {
      for (int step = 0; step < 50; ++step) {
        writer.AppendVersions("job-1", {Entry(t, step)});
      }
    });
  }
  threads.emplace_back([&writer] {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(writer.Flush().ok());
  });
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ((*store)->LoadVersions("job-1", 0)->size(), 200u);
}

}  // namespace
}  // namespace pipetrain
