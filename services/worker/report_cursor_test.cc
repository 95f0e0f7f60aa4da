#include "services/worker/report_cursor.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A report of job "job-1" with the results of steps [from, to).
v1::StageReport Results(int64_t from, int64_t to, int64_t attempt = 1) {
  v1::StageReport r;
  r.set_job_id("job-1");
  r.set_attempt(attempt);
  for (int64_t s = from; s < to; ++s) {
    r.mutable_status()->add_results()->set_step(s);
  }
  return r;
}

v1::HeartbeatResponse Answer(const std::string& instance, uint64_t report,
                             uint64_t durable) {
  v1::HeartbeatResponse a;
  a.set_scheduler_instance(instance);
  a.set_report_sequence(report);
  a.set_durable_sequence(durable);
  return a;
}

TEST(ReportCursorTest, ResultsAreReportedUntilTheirRecordIsOnDisk) {
  ReportCursor cursor;
  v1::StageReport first = Results(0, 10);
  EXPECT_TRUE(cursor.IsNew(first));
  cursor.Answered(&first, Answer("a", 3, 2));
  EXPECT_FALSE(cursor.IsNew(first));
  EXPECT_EQ(cursor.since(), 0);  // acknowledged, not yet written
  v1::StageReport second = Results(0, 15);
  cursor.Answered(&second, Answer("a", 5, 3));
  EXPECT_EQ(cursor.since(), 10);  // record 3 (steps 0-9) is on disk
  v1::StageReport third = Results(10, 20);
  cursor.Answered(&third, Answer("a", 7, 7));
  EXPECT_EQ(cursor.since(), 20);
  cursor.Answered(nullptr, Answer("a", 0, 7));
  EXPECT_EQ(cursor.since(), 20);
}

// The chaos test's loss: a scheduler acknowledged steps 0-9 and was killed
// before writing them; the worker's next heartbeat reached its successor.
// That heartbeat must carry steps 0-9 again, since the worker may be
// killed before the one after it.
TEST(ReportCursorTest, ASuccessorGetsTheResultsItsPredecessorDidNotWrite) {
  ReportCursor cursor;
  v1::StageReport first = Results(0, 10);
  cursor.Answered(&first, Answer("a", 40, 39));
  ASSERT_EQ(cursor.since(), 0);
  v1::StageReport second = Results(cursor.since(), 14);
  // The successor numbers its records from 1: record 40 of its
  // predecessor is not its record 40.
  cursor.Answered(&second, Answer("b", 2, 45));
  EXPECT_EQ(cursor.since(), 14);
  // And every result is reported again once, in case its disk holds less.
  EXPECT_TRUE(cursor.IsNew(second));
}

TEST(ReportCursorTest, APredecessorsRecordsDoNotSettleOnItsSuccessorsDisk) {
  ReportCursor cursor;
  v1::StageReport first = Results(0, 10);
  cursor.Answered(&first, Answer("a", 40, 39));
  // The successor's first answer carried no report (the stage was
  // between configurations) but says record 50 is on its disk.
  cursor.Answered(nullptr, Answer("b", 0, 50));
  EXPECT_EQ(cursor.since(), 0);
}

TEST(ReportCursorTest, IgnoredReportsAreNotRepeated) {
  ReportCursor cursor;
  v1::StageReport first = Results(0, 10);
  cursor.Answered(&first, Answer("a", 0, 0));
  EXPECT_EQ(cursor.since(), 10);
}

TEST(ReportCursorTest, ANewConfigurationStartsFromItsFirstResult) {
  ReportCursor cursor;
  v1::StageReport before = Results(0, 30, /*attempt=*/1);
  cursor.Answered(&before, Answer("a", 1, 1));
  ASSERT_EQ(cursor.since(), 30);
  v1::StageReport after = Results(20, 25, /*attempt=*/2);
  EXPECT_TRUE(cursor.IsNew(after));
  cursor.Answered(&after, Answer("a", 2, 1));
  EXPECT_EQ(cursor.since(), 0);
  cursor.Answered(nullptr, Answer("a", 0, 2));
  EXPECT_EQ(cursor.since(), 25);
}

TEST(ReportCursorTest, AFailedHeartbeatOrAForgottenWorkerReportsEverything) {
  ReportCursor cursor;
  v1::StageReport first = Results(0, 10);
  cursor.Answered(&first, Answer("a", 1, 1));
  ASSERT_FALSE(cursor.IsNew(first));
  cursor.ReportAll();
  EXPECT_TRUE(cursor.IsNew(first));

  ReportCursor forgotten;
  forgotten.Answered(&first, Answer("a", 1, 1));
  v1::HeartbeatResponse again = Answer("a", 0, 1);
  again.set_register_again(true);
  v1::StageReport second = Results(10, 12);
  forgotten.Answered(&second, again);
  EXPECT_TRUE(forgotten.IsNew(second));
  EXPECT_EQ(forgotten.since(), 10);  // the dropped report settled nothing
}

}  // namespace
}  // namespace pipetrain
