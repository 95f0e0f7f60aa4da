// The fixture of SchedulerCore's tests: a core driven through
// FakeStageControl with no processes, no network and a fake clock. Tests
// play the workers' side (register, heartbeat with the fake stages'
// reports) and call Tick themselves.
#ifndef PIPETRAIN_SCHEDULER_SCHEDULER_CORE_TEST_FIXTURE_H_
#define PIPETRAIN_SCHEDULER_SCHEDULER_CORE_TEST_FIXTURE_H_

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/fake_stage_control.h"
#include "scheduler/scheduler_core.h"

namespace pipetrain {
namespace testing_core {

using Method = FakeStageControl::Method;

inline constexpr int64_t kLeaseMs = 3000;

// Accepts every spec; GPipe's bubble (K - 1) / (M + K - 1).
class FakeModelSupport final : public ModelSupport {
 public:
  absl::Status Validate(const v1::TrainingSpec&) override {
    return absl::OkStatus();
  }
  double TheoreticalBubble(const v1::JobSpec& spec, int k) override {
    const double m = std::max<int64_t>(1, spec.training().micro_batches());
    return (k - 1) / (m + k - 1);
  }
};

using TempDir = ScopedTempDir;

inline v1::JobSpec Spec(int stages, int64_t steps) {
  v1::JobSpec spec;
  spec.set_num_stages(stages);
  spec.set_eval_samples(1000);
  v1::TrainingSpec* t = spec.mutable_training();
  t->set_name("mlp");
  t->set_batch_size(64);
  t->set_micro_batches(4);
  t->set_steps(steps);
  for (int l = 0; l < 6; ++l) t->mutable_model()->add_layers();
  return spec;
}

class SchedulerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::EvalResult eval;
    eval.set_loss(0.75);
    eval.set_accuracy(0.625);
    eval.set_samples(1000);
    control_.SetEvalResult(eval);
  }

  std::unique_ptr<SchedulerCore> MakeCore(StageControl* control,
                                          const std::string& data_dir = "",
                                          bool action_threads = false,
                                          MetricsRegistry* metrics = nullptr) {
    SchedulerOptions options;
    options.data_dir = data_dir;
    options.registry.lease_seconds = kLeaseMs / 1000.0;
    options.control_thread = false;
    options.action_threads = action_threads;
    options.now_ms = [this] { return now_ms_.load(); };
    options.checkpoints = checkpoints_;
    options.registry.lost_expiry_seconds = lost_expiry_seconds_;
    auto core = SchedulerCore::Create(options, control, &model_, metrics);
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? std::move(*core) : nullptr;
  }

  void Start(bool action_threads = false) {
    core_ = MakeCore(&control_, "", action_threads, &metrics_);
  }

  // Registers `n` workers and heartbeats them to IDLE.
  void AddWorkers(int n) { AddWorkersAt(std::vector<double>(n, 10)); }

  // Registers a worker per GEMM speed, 10.0.0.i:7000 measuring gflops[i],
  // and heartbeats them to IDLE.
  void AddWorkersAt(const std::vector<double>& gflops) {
    for (size_t i = 0; i < gflops.size(); ++i) {
      v1::RegisterWorkerRequest r;
      r.mutable_worker()->set_address(absl::StrCat("10.0.0.", i, ":7000"));
      r.mutable_worker()->set_memory_bytes(int64_t{1} << 30);
      r.mutable_worker()->set_gemm_gflops(gflops[i]);
      auto registered = core_->RegisterWorker(r);
      ASSERT_TRUE(registered.ok()) << registered.status();
      workers_[registered->worker_id()] = r.worker().address();
    }
    Heartbeats();
  }

  // Every worker heartbeats (except `silent`), carrying its stage's report.
  void Heartbeats(SchedulerCore* core = nullptr,
                  const std::string& silent = "") {
    core = core != nullptr ? core : core_.get();
    for (const auto& [id, address] : workers_) {
      if (id == silent) continue;
      v1::HeartbeatRequest h;
      h.set_worker_id(id);
      if (auto report = control_.Report(address)) *h.mutable_report() = *report;
      ASSERT_TRUE(core->Heartbeat(h).ok());
    }
  }

  v1::Job Submit(const v1::JobSpec& spec) {
    v1::SubmitJobRequest r;
    *r.mutable_spec() = spec;
    auto job = core_->SubmitJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::Job Job(const std::string& id, SchedulerCore* core = nullptr) {
    v1::GetJobRequest r;
    r.set_job_id(id);
    auto job = (core != nullptr ? core : core_.get())->GetJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::JobActionRequest Action(const std::string& id) {
    v1::JobActionRequest r;
    r.set_job_id(id);
    return r;
  }

  std::vector<std::string> PlannedAddresses(const std::string& id) {
    v1::GetPlanRequest r;
    r.set_job_id(id);
    auto plan = core_->GetPlan(r);
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::vector<std::string> out;
    if (plan.ok()) {
      for (const auto& s : plan->stages()) out.push_back(s.worker_address());
    }
    return out;
  }

  std::map<std::string, v1::WorkerState> WorkerStates(
      SchedulerCore* core = nullptr) {
    auto listed = (core != nullptr ? core : core_.get())
                      ->ListWorkers(v1::ListWorkersRequest());
    std::map<std::string, v1::WorkerState> out;
    for (const auto& w : listed->workers()) out[w.id()] = w.state();
    return out;
  }

  bool AllIdle(SchedulerCore* core = nullptr) {
    for (const auto& [id, state] : WorkerStates(core)) {
      if (state != v1::WORKER_STATE_IDLE) return false;
    }
    return true;
  }

  // Starts a 3-stage job of `steps` steps (on 3 new workers unless told
  // otherwise) and returns it RUNNING.
  v1::Job RunningJob(int64_t steps = 6, bool add_workers = true) {
    if (add_workers) AddWorkers(3);
    const v1::Job job = Submit(Spec(3, steps));
    core_->Tick();
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
    return Job(job.id());
  }

  // Trains every stage `steps` further and lets the scheduler see it.
  void Train(int64_t steps) {
    control_.Advance(steps);
    Heartbeats();
    core_->Tick();
  }

  static std::vector<std::string> AddressesOf(
      const std::vector<FakeStageControl::Call>& calls) {
    std::vector<std::string> out;
    for (const auto& c : calls) out.push_back(c.address);
    return out;
  }
  static std::set<std::string> AddressSet(
      const std::vector<FakeStageControl::Call>& calls) {
    std::set<std::string> out;
    for (const auto& c : calls) out.insert(c.address);
    return out;
  }

  v1::Plan PlanOf(const std::string& job_id) {
    v1::GetPlanRequest r;
    r.set_job_id(job_id);
    auto plan = core_->GetPlan(r);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::Plan();
  }

  // The worker of `stage` dies: it answers nothing, stops heartbeating and
  // misses its lease; the next tick sees it. Returns its id.
  std::string KillStage(const std::string& job_id, int stage) {
    const v1::PlannedStage s = PlanOf(job_id).stages(stage);
    control_.Kill(s.worker_address());
    workers_.erase(s.worker_id());
    now_ms_ += kLeaseMs + 1;
    Heartbeats();
    core_->Tick();
    return s.worker_id();
  }

  std::vector<v1::JobEventKind> EventKinds(const v1::Job& job) {
    std::vector<v1::JobEventKind> out;
    for (const v1::JobEvent& e : job.events()) out.push_back(e.kind());
    return out;
  }

  std::vector<FakeStageControl::Call> ConfiguresSince(size_t n) {
    const auto all = control_.CallsOf(Method::kConfigure);
    return {all.begin() + n, all.end()};
  }

  v1::Job RunningJobOn(int workers, int stages, int64_t steps,
                       int max_restarts = 0) {
    AddWorkers(workers);
    v1::JobSpec spec = Spec(stages, steps);
    spec.mutable_training()->set_max_restarts(max_restarts);
    const v1::Job job = Submit(spec);
    core_->Tick();
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
    return Job(job.id());
  }

  std::atomic<int64_t> now_ms_{1'000'000};
  // Given to cores MakeCore builds when set (borrowed).
  CheckpointStore* checkpoints_ = nullptr;
  double lost_expiry_seconds_ = 0;
  FakeStageControl control_;
  FakeModelSupport model_;
  MetricsRegistry metrics_;
  std::map<std::string, std::string> workers_;  // id -> address
  std::unique_ptr<SchedulerCore> core_;
};

}  // namespace testing_core
}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_SCHEDULER_CORE_TEST_FIXTURE_H_
