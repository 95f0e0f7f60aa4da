#include "services/ctl/watch.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace ctl {
namespace {

v1::Job JobWithEvaluations(v1::JobState state, int n) {
  v1::Job job;
  job.set_id("job-3");
  job.set_state(state);
  for (int i = 1; i <= n; ++i) {
    v1::EvalResult* e = job.add_evaluations();
    e->set_step(100 * i);
    e->set_loss(1.0 / i);
    e->set_accuracy(0.5 + 0.1 * i);
    e->set_samples(1000);
  }
  if (n > 0) *job.mutable_eval() = job.evaluations(n - 1);
  return job;
}

TEST(EvaluationFeed, ShowsTheLatestFirstThenEachNewOneOnce) {
  EvaluationFeed feed;
  EXPECT_EQ(feed.NewLines(JobWithEvaluations(v1::JOB_STATE_RUNNING, 2)),
            std::vector<std::string>{
                "job-3 evaluation at step 200: loss 0.5000, test accuracy "
                "70.0% on 1000 samples"});
  EXPECT_TRUE(
      feed.NewLines(JobWithEvaluations(v1::JOB_STATE_RUNNING, 2)).empty());
  EXPECT_EQ(feed.NewLines(JobWithEvaluations(v1::JOB_STATE_PAUSED, 4)),
            (std::vector<std::string>{
                "job-3 evaluation at step 300: loss 0.3333, test accuracy "
                "80.0% on 1000 samples",
                "job-3 evaluation at step 400: loss 0.2500, test accuracy "
                "90.0% on 1000 samples"}));
  // The final evaluation belongs to the summary, not a line of its own.
  EXPECT_TRUE(
      feed.NewLines(JobWithEvaluations(v1::JOB_STATE_COMPLETED, 5)).empty());
}

TEST(EvaluationFeed, NothingBeforeTheFirstEvaluation) {
  EvaluationFeed feed;
  EXPECT_TRUE(
      feed.NewLines(JobWithEvaluations(v1::JOB_STATE_RUNNING, 0)).empty());
  EXPECT_EQ(feed.NewLines(JobWithEvaluations(v1::JOB_STATE_RUNNING, 1)).size(),
            1u);
}

v1::Job JobWithEvents(int n) {
  v1::Job job;
  job.set_id("job-3");
  job.set_state(v1::JOB_STATE_RUNNING);
  const v1::JobEventKind kinds[] = {
      v1::JOB_EVENT_SUBMITTED, v1::JOB_EVENT_STARTED, v1::JOB_EVENT_WORKER_LOST,
      v1::JOB_EVENT_RECOVERED};
  for (int i = 0; i < n; ++i) {
    v1::JobEvent* e = job.add_events();
    e->set_kind(kinds[i]);
    e->set_unix_ms(i < 2 ? 1000 : 2000);  // two pairs at one instant
    e->set_step(i < 3 ? 0 : 40);
  }
  if (n == 4) {
    job.mutable_events(2)->set_message("worker w-2 of stage 1 was lost");
    job.mutable_events(3)->set_message("resumed at step 40 from version 40");
    job.mutable_events(3)->set_seconds(2.5);
  }
  return job;
}

TEST(EventFeed, ShowsOnlyEventsThatArriveWhileWatchingEachOnce) {
  EventFeed feed;
  EXPECT_TRUE(feed.NewLines(JobWithEvents(2)).empty());
  EXPECT_EQ(feed.NewLines(JobWithEvents(3)),
            std::vector<std::string>{"job-3 worker lost at step 0"});
  EXPECT_EQ(feed.NewLines(JobWithEvents(4)),
            std::vector<std::string>{
                "job-3 recovered at step 40: resumed at step 40 from version "
                "40 (2.50 s)"});
  EXPECT_TRUE(feed.NewLines(JobWithEvents(4)).empty());
}

}  // namespace
}  // namespace ctl
}  // namespace pipetrain
