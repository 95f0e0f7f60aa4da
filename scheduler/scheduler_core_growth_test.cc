// SchedulerCore's elastic growth: a job re-planned onto fewer stages after a
// loss takes in a worker that joins, at the next committed checkpoint, when
// the planner predicts a step at least 20% faster; a spare that would not
// speed the job up is left idle and not judged again.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/elastic_growth.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::HasSubstr;

class GrowthTest : public SchedulerCoreTest {
 protected:
  void SetUp() override {
    SchedulerCoreTest::SetUp();
    auto store = CheckpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    checkpoints_ = store_.get();
    Start();
  }

  // A 3-stage job checkpointing every 4 steps. The fake profile gives
  // every one of the 6 layers the same cost; with 8 micro-batches GPipe's
  // predicted step on 3 stages is 60/81 of that on 2.
  v1::Job RunningJob3(int workers, int micro_batches) {
    AddWorkers(workers);
    v1::JobSpec spec = Spec(3, 24);
    spec.mutable_training()->set_checkpoint_every(4);
    spec.mutable_training()->set_micro_batches(micro_batches);
    const v1::Job job = Submit(spec);
    core_->Tick();
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
    return Job(job.id());
  }

  // A worker that starts later, at an address no other worker had.
  std::string JoinWorker() {
    v1::RegisterWorkerRequest r;
    r.mutable_worker()->set_address("10.0.0.9:7000");
    r.mutable_worker()->set_memory_bytes(int64_t{1} << 30);
    r.mutable_worker()->set_gemm_gflops(10);
    auto registered = core_->RegisterWorker(r);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return "";
    workers_[registered->worker_id()] = r.worker().address();
    Heartbeats();
    return registered->worker_id();
  }

  int EventsOf(const v1::Job& job, v1::JobEventKind kind) {
    int n = 0;
    for (const v1::JobEvent& e : job.events()) n += e.kind() == kind;
    return n;
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(GrowthTest, ADegradedJobTakesInAJoiningWorkerAtTheNextCheckpoint) {
  const v1::Job job = RunningJob3(3, 8);
  Train(5);  // checkpoint at step 4
  KillStage(job.id(), 2);
  ASSERT_EQ(PlanOf(job.id()).stages_size(), 2);
  const std::string joined = JoinWorker();
  Train(1);  // the recovered job steps; the idle worker is noted
  EXPECT_EQ(PlanOf(job.id()).stages_size(), 2);
  EXPECT_EQ(WorkerStates()[joined], v1::WORKER_STATE_IDLE);
  Train(4);  // at step 9: checkpoint 8 is committed
  EXPECT_EQ(PlanOf(job.id()).stages_size(), 2);
  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  Train(0);  // judged against checkpoint 8: the job grows

  const v1::Plan grown = PlanOf(job.id());
  ASSERT_EQ(grown.stages_size(), 3);
  bool uses_joined = false;
  for (const auto& s : grown.stages()) uses_joined |= s.worker_id() == joined;
  EXPECT_TRUE(uses_joined);
  EXPECT_EQ(WorkerStates()[joined], v1::WORKER_STATE_ASSIGNED);
  // Every stage of the new cut starts from checkpoint 8, restoring it.
  const auto again = ConfiguresSince(configured);
  ASSERT_EQ(again.size(), 3u);
  for (const auto& c : again) {
    EXPECT_EQ(c.config.start_step(), 8);
    EXPECT_TRUE(c.config.restore_expected());
    EXPECT_EQ(c.config.num_stages(), 3);
  }
  const v1::Job growing = Job(job.id());
  EXPECT_EQ(growing.restarts(), 1);  // a growth spends no restart
  ASSERT_EQ(growing.rollbacks_size(), 2);
  EXPECT_EQ(growing.rollbacks(1).from_step(), 9);
  EXPECT_EQ(growing.rollbacks(1).to_step(), 8);
  const v1::JobEvent last = *growing.events().rbegin();
  EXPECT_EQ(last.kind(), v1::JOB_EVENT_REPLANNED);
  EXPECT_THAT(last.message(), HasSubstr("grew from 2 to 3 stages"));
  EXPECT_EQ(last.step(), 8);

  Train(16);
  const v1::Job done = Job(job.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), 24);
  // One recovery (the loss), none for the growth.
  EXPECT_EQ(EventsOf(done, v1::JOB_EVENT_RECOVERED), 1);
  EXPECT_EQ(EventsOf(done, v1::JOB_EVENT_REPLANNED), 2);
  EXPECT_THAT(metrics_.RenderText(),
              HasSubstr("pipetrain_scheduler_recovery_seconds_count 1"));
}

// The growth's re-configuration fails on the joining worker (as when a
// worker dies just as the job moves onto it): the recovery path takes
// over, and the event log says why, as it does for any recovery.
TEST_F(GrowthTest, AGrowthWhoseRestartFailsIsRecoveredAndLogged) {
  const v1::Job job = RunningJob3(3, 8);
  Train(5);
  KillStage(job.id(), 2);
  const std::string joined = JoinWorker();
  Train(1);
  Train(4);  // checkpoint 8 committed
  control_.FailNext(Method::kConfigure, workers_[joined],
                    absl::InternalError("configure refused"));
  Train(0);  // grows; the joining stage's configure fails
  Train(0);  // the recovery
  // After the growth's event (the job's last REPLANNED), the loss.
  const v1::Job recovering = Job(job.id());
  int grew = -1;
  for (int i = 0; i < recovering.events_size(); ++i) {
    if (recovering.events(i).kind() == v1::JOB_EVENT_REPLANNED) grew = i;
  }
  ASSERT_GE(grew, 0) << recovering.DebugString();
  EXPECT_THAT(recovering.events(grew).message(), HasSubstr("grew from 2 to 3"));
  ASSERT_LT(grew + 1, recovering.events_size()) << recovering.DebugString();
  const v1::JobEvent& lost = recovering.events(grew + 1);
  EXPECT_EQ(lost.kind(), v1::JOB_EVENT_WORKER_LOST);
  EXPECT_THAT(lost.message(), HasSubstr("could not restart after growing"));
  EXPECT_THAT(lost.message(), HasSubstr("configure refused"));
  Train(16);
  const v1::Job done = Job(job.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), 24);
  EXPECT_EQ(EventsOf(done, v1::JOB_EVENT_WORKER_LOST), 2);
  EXPECT_EQ(EventsOf(done, v1::JOB_EVENT_RECOVERED), 2);
}

// Steps fast enough that every tick finds a new checkpoint boundary passed
// (so a checkpoint is always due when growth is judged): the job still
// grows, from the checkpoint committed after the worker was noted.
TEST_F(GrowthTest, AJobPassingACheckpointAtEveryTickStillGrows) {
  const v1::Job job = RunningJob3(3, 8);
  Train(5);  // checkpoint at step 4
  KillStage(job.id(), 2);
  ASSERT_EQ(PlanOf(job.id()).stages_size(), 2);
  JoinWorker();
  for (int i = 0; i < 4 && PlanOf(job.id()).stages_size() == 2; ++i) {
    Train(4);  // every tick lands on a checkpoint boundary
  }
  ASSERT_EQ(PlanOf(job.id()).stages_size(), 3);
  const v1::JobEvent last = *Job(job.id()).events().rbegin();
  EXPECT_THAT(last.message(), HasSubstr("grew from 2 to 3 stages"));
  EXPECT_EQ(last.step() % 4, 0);
  Train(24);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(GrowthTest, ASpareThatWouldNotSpeedTheJobUpStaysIdle) {
  // 3 fixed stages on equal workers: a fourth predicts the same step.
  const v1::Job job = RunningJob3(4, 4);
  const v1::Plan before = PlanOf(job.id());
  const size_t profiles = control_.CallsOf(Method::kProfile).size();
  for (int i = 0; i < 5; ++i) Train(3);  // checkpoints 4, 8, 12
  const v1::Plan after = PlanOf(job.id());
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(after.stages(s).worker_id(), before.stages(s).worker_id());
  }
  // Judged once (a profile on the spare), not at every checkpoint. The
  // spare is timed while the job trains: the fastest of nine runs per
  // layer; the job's first plan took the median of three on an idle host.
  const auto profiled = control_.CallsOf(Method::kProfile);
  ASSERT_EQ(profiled.size(), profiles + 1);
  EXPECT_EQ(profiled.front().arg, 3);
  EXPECT_EQ(profiled.back().arg, -9);
  const v1::Job running = Job(job.id());
  EXPECT_EQ(EventsOf(running, v1::JOB_EVENT_REPLANNED), 0);
  EXPECT_TRUE(running.rollbacks().empty());
  // The user sees why: one event, naming the spare and both predictions.
  ASSERT_EQ(EventsOf(running, v1::JOB_EVENT_GROWTH_DECLINED), 1);
  for (const v1::JobEvent& e : running.events()) {
    if (e.kind() != v1::JOB_EVENT_GROWTH_DECLINED) continue;
    EXPECT_TRUE(absl::StrContains(e.message(), "stays on 3 stages"))
        << e.message();
    EXPECT_TRUE(absl::StrContains(e.message(), "w-4")) << e.message();
  }
  Train(24);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(GrowthTest, AJobWaitingToStartHasTheFirstClaimOnIdleWorkers) {
  const v1::Job job = RunningJob3(3, 8);
  Train(5);
  KillStage(job.id(), 2);
  const v1::Job waiting = Submit(Spec(2, 4));  // needs two idle workers
  JoinWorker();
  for (int i = 0; i < 4; ++i) Train(3);  // checkpoints 8 and 12 pass
  EXPECT_EQ(PlanOf(job.id()).stages_size(), 2);
  EXPECT_EQ(Job(waiting.id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(EventsOf(Job(job.id()), v1::JOB_EVENT_REPLANNED), 1);
}

// A job of M = 4 over six layers of 1 ms forward, 2 ms backward, 1 KiB
// out and 4 KiB of weights (the profile), GPipe's bubble, no workers yet.
GrowthInputs SixLayerGrowth() {
  GrowthInputs in;
  in.spec.set_num_stages(0);
  in.spec.mutable_training()->set_micro_batches(4);
  for (int l = 0; l < 6; ++l) {
    v1::LayerProfile* p = in.profile.add_layers();
    p->set_forward_seconds(0.001);
    p->set_backward_seconds(0.002);
    p->set_activation_bytes(1024);
    p->set_parameter_bytes(4096);
  }
  return in;
}

TEST(ElasticGrowth, ProposesOnlyAGainOfAtLeastTwentyPercent) {
  GrowthInputs in = SixLayerGrowth();
  auto worker = [](const std::string& id, double gflops) {
    v1::WorkerInfo w;
    w.set_id(id);
    w.set_memory_bytes(int64_t{1} << 30);
    w.set_gemm_gflops(gflops);
    return w;
  };
  in.current = {worker("a", 10)};
  in.current_stages = 1;
  in.joining = {worker("b", 10)};
  // One stage: 4 x 18 ms; two: 5 x 9 ms (plus 1 KiB across the cut, a
  // microsecond), 37.5% less.
  auto two = ProposeGrowth(in);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_NEAR(two->current_seconds, 0.072, 1e-9);
  EXPECT_NEAR(two->proposed_seconds, 0.045, 1e-5);
  EXPECT_TRUE(two->worthwhile);
  EXPECT_EQ(two->plan.stages_size(), 2);
  EXPECT_THAT(GrowthMessage(*two, 1), HasSubstr("grew from 1 to 2 stages"));
  // The same joining worker at a tenth of the speed (profiled on it, so
  // the current worker is rescaled to ten times faster): no gain.
  in.joining = {worker("b", 1)};
  auto slow = ProposeGrowth(in);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_NEAR(slow->current_seconds, 0.0072, 1e-9);
  EXPECT_FALSE(slow->worthwhile);
}

// Workers of one kind whose GEMM micro-benchmarks differ by noise (here
// 1.4x, within kSameKindGemmSpread) plan at one speed: a job on two of
// them is not moved onto two others (by GEMM speed the move would predict
// a 29% shorter step and be made).
TEST(ElasticGrowth, NoMoveOntoWorkersOfTheSameKind) {
  GrowthInputs in = SixLayerGrowth();
  auto worker = [](const std::string& id, const std::string& device,
                   double gflops) {
    v1::WorkerInfo w;
    w.set_id(id);
    w.set_device(device);
    w.set_memory_bytes(int64_t{1} << 30);
    w.set_gemm_gflops(gflops);
    return w;
  };
  in.spec.set_num_stages(2);
  in.current = {worker("a", "cpu", 10), worker("b", "cpu", 10)};
  in.current_stages = 2;
  in.joining = {worker("c", "cpu", 14), worker("d", "cpu", 14)};
  auto same = ProposeGrowth(in);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_NEAR(same->proposed_seconds, same->current_seconds, 1e-9);
  EXPECT_FALSE(same->worthwhile);
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
