#include "scheduler/job_table.h"

#include <filesystem>
#include <set>
#include <utility>

#include "common/temp_dir_for_test.h"
#include "gtest/gtest.h"
#include "scheduler/job_state.h"
#include "scheduler/state_store.h"
#include "scheduler/state_writer.h"

namespace pipetrain {
namespace {

using S = v1::JobState;

constexpr S kStates[] = {v1::JOB_STATE_PENDING,   v1::JOB_STATE_PLANNING,
                         v1::JOB_STATE_RUNNING,   v1::JOB_STATE_PAUSED,
                         v1::JOB_STATE_COMPLETED, v1::JOB_STATE_FAILED,
                         v1::JOB_STATE_CANCELLED};

// The machine as the design states it, edge by edge.
const std::set<std::pair<S, S>>& LegalEdges() {
  static const auto* edges = new std::set<std::pair<S, S>>{
      {v1::JOB_STATE_PENDING, v1::JOB_STATE_PLANNING},
      {v1::JOB_STATE_PENDING, v1::JOB_STATE_CANCELLED},
      {v1::JOB_STATE_PLANNING, v1::JOB_STATE_RUNNING},
      {v1::JOB_STATE_PLANNING, v1::JOB_STATE_PENDING},
      {v1::JOB_STATE_PLANNING, v1::JOB_STATE_FAILED},
      {v1::JOB_STATE_PLANNING, v1::JOB_STATE_CANCELLED},
      {v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED},
      {v1::JOB_STATE_RUNNING, v1::JOB_STATE_COMPLETED},
      {v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED},
      {v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLED},
      {v1::JOB_STATE_PAUSED, v1::JOB_STATE_RUNNING},
      {v1::JOB_STATE_PAUSED, v1::JOB_STATE_FAILED},
      {v1::JOB_STATE_PAUSED, v1::JOB_STATE_CANCELLED},
  };
  return *edges;
}

TEST(JobStateTest, EveryPairOfStatesFollowsTheMachine) {
  for (S from : kStates) {
    for (S to : kStates) {
      const bool legal = LegalEdges().count({from, to}) > 0;
      EXPECT_EQ(IsLegalJobTransition(from, to), legal)
          << v1::JobState_Name(from) << " -> " << v1::JobState_Name(to);
      EXPECT_EQ(CheckJobTransition(from, to).ok(), legal);
    }
  }
  EXPECT_FALSE(
      IsLegalJobTransition(v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_PENDING));
  const absl::Status s =
      CheckJobTransition(v1::JOB_STATE_COMPLETED, v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_EQ(s.message(),
            "a job cannot go from JOB_STATE_COMPLETED to JOB_STATE_RUNNING");
  for (S state : kStates) {
    EXPECT_EQ(IsTerminalJobState(state), state == v1::JOB_STATE_COMPLETED ||
                                             state == v1::JOB_STATE_FAILED ||
                                             state == v1::JOB_STATE_CANCELLED);
  }
}

using TempDir = ScopedTempDir;

v1::JobSpec NamedSpec(const std::string& name) {
  v1::JobSpec spec;
  spec.mutable_training()->set_name(name);
  spec.mutable_training()->set_steps(7);
  return spec;
}

TEST(JobTableTest, TransitionsMoveAlongTheMachineAndArePersisted) {
  TempDir dir;
  auto store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  StateWriter writer(store->get());
  JobTable table(&writer);
  JobRecord* job = table.Add(NamedSpec("a"), 100);
  EXPECT_EQ(job->job.id(), "job-1");
  EXPECT_EQ(job->job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job->job.total_steps(), 7);
  EXPECT_EQ(table.Add(NamedSpec(""), 101)->job.name(), "job-2");

  EXPECT_TRUE(table.Transition(job, v1::JOB_STATE_PLANNING, 200).ok());
  const absl::Status illegal =
      table.Transition(job, v1::JOB_STATE_COMPLETED, 300);
  EXPECT_TRUE(absl::IsFailedPrecondition(illegal));
  EXPECT_EQ(job->job.state(), v1::JOB_STATE_PLANNING);
  EXPECT_EQ(job->job.updated_unix_ms(), 200);

  ASSERT_TRUE(writer.Flush().ok());
  auto loaded = (*store)->LoadJobs();
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].state(), v1::JOB_STATE_PLANNING);
  EXPECT_TRUE(absl::IsNotFound(table.Find("job-9").status()));
}

TEST(JobTableTest, RestoreKeepsStatesDropsStalePlansAndContinuesIds) {
  std::vector<v1::Job> jobs(3);
  jobs[0].set_id("job-4");
  jobs[0].set_state(v1::JOB_STATE_RUNNING);
  jobs[0].add_evaluations()->set_step(40);
  jobs[0].add_evaluations()->set_step(80);
  jobs[1].set_id("job-7");
  jobs[1].set_state(v1::JOB_STATE_PENDING);
  jobs[2].set_id("job-5");
  jobs[2].set_state(v1::JOB_STATE_PLANNING);
  std::map<std::string, v1::Plan> plans;
  for (const char* id : {"job-4", "job-7", "job-5"}) {
    plans[id].set_job_id(id);
    plans[id].add_stages()->set_worker_address("a:1");
    plans[id].add_stages()->set_worker_address("b:1");
  }
  JobTable table(nullptr);
  table.Restore(jobs, plans);
  EXPECT_EQ(table.ids(), (std::vector<std::string>{"job-4", "job-7", "job-5"}));
  JobRecord* running = *table.Find("job-4");
  EXPECT_EQ(running->Addresses(), (std::vector<std::string>{"a:1", "b:1"}));
  EXPECT_EQ(running->reports.size(), 2u);
  EXPECT_EQ(running->last_reported_eval_step, 80);
  EXPECT_FALSE((*table.Find("job-7"))->plan.has_value());  // stale
  EXPECT_EQ((*table.Find("job-5"))->job.state(), v1::JOB_STATE_PLANNING);
  EXPECT_TRUE((*table.Find("job-5"))->plan.has_value());
  EXPECT_EQ(table.Add(NamedSpec("n"), 1)->job.id(), "job-8");

  table.ClearPlan(running);
  EXPECT_TRUE(running->Addresses().empty());
  EXPECT_TRUE(running->reports.empty());
}

}  // namespace
}  // namespace pipetrain
