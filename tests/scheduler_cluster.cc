#include "tests/scheduler_cluster.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/proto_json.h"
#include "google/protobuf/util/json_util.h"
#include "services/rpc/grpc_util.h"
#include "worker/compute/cpu/cpu_backend.h"

namespace pipetrain::testing {

using Clock = std::chrono::steady_clock;

namespace {

Clock::time_point After(double seconds) {
  return Clock::now() + std::chrono::milliseconds(int(seconds * 1000));
}

}  // namespace

std::vector<std::string> SchedulerFlags() {
  return {"--lease_seconds=1.5", "--heartbeat_seconds=0.2"};
}

v1::TrainingSpec LoadSpec(const std::string& name, int64_t steps) {
  v1::TrainingSpec spec;
  const absl::Status read = ReadJsonFile(SourcePath("examples/" + name), &spec);
  EXPECT_TRUE(read.ok()) << read;
  spec.set_steps(steps);
  spec.set_epochs(0);
  return spec;
}

v1::TrainingSpec MlpSpec(int64_t steps) {
  return LoadSpec("fashion_mnist_mlp.job.json", steps);
}

std::string ToJsonString(const google::protobuf::Message& m) {
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out);
  return out;
}

ReferenceRun TrainInProcess(const v1::TrainingSpec& spec, int64_t steps,
                            int64_t eval_samples) {
  ReferenceRun out;
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  if (!trainer.ok()) {
    ADD_FAILURE() << "reference trainer: " << trainer.status();
    return out;
  }
  const int64_t n = steps >= 0 ? steps : spec.steps();
  for (int64_t i = 0; i < n; ++i) {
    auto step = (*trainer)->Step();
    if (!step.ok()) {
      ADD_FAILURE() << "reference step " << i << ": " << step.status();
      return out;
    }
    out.losses.push_back(step->loss);
  }
  auto eval = (*trainer)->Evaluate(eval_samples);
  if (!eval.ok()) {
    ADD_FAILURE() << "reference evaluation: " << eval.status();
    return out;
  }
  out.eval = *eval;
  return out;
}

std::vector<std::vector<float>> ReferenceWeights(const v1::TrainingSpec& spec) {
  std::vector<std::vector<float>> out;
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  for (int64_t i = 0; i < spec.steps(); ++i) {
    auto step = (*trainer)->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return out;
  }
  auto params = (*trainer)->model()->ParamsToHost();
  EXPECT_TRUE(params.ok()) << params.status();
  if (!params.ok()) return out;
  for (const Tensor& t : *params) out.push_back(t.ToVector());
  return out;
}

void ExpectWeightsNear(const std::vector<std::vector<float>>& got,
                       const std::vector<std::vector<float>>& want, double abs,
                       const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  for (size_t p = 0; p < std::min(got.size(), want.size()); ++p) {
    EXPECT_EQ(got[p].size(), want[p].size()) << what << ": parameter " << p;
    for (size_t i = 0; i < std::min(got[p].size(), want[p].size()); ++i) {
      if (std::fabs(got[p][i] - want[p][i]) > abs) {
        ADD_FAILURE() << what << ": parameter " << p << "[" << i << "] is "
                      << got[p][i] << ", the fault-free run has " << want[p][i]
                      << " (absolute tolerance " << abs << ")";
        return;
      }
    }
  }
}

std::vector<std::string> PinnedLinkFlags() {
  return {"--zone_bandwidth=z0-z0=1e10,z0-z1=1e10,z1-z1=1e10",
          "--zone_latency=z0-z0=0,z0-z1=0,z1-z1=0",
          "--message_overhead_seconds=0"};
}

void SchedulerTest::SetUp() {
  std::vector<std::string> flags = SchedulerFlags();
  flags.insert(flags.end(), extra_scheduler_flags_.begin(),
               extra_scheduler_flags_.end());
  auto s = StartScheduler(dir_.path(), flags);
  ASSERT_TRUE(s.ok()) << s.status();
  scheduler_ = std::move(*s);
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> worker_flags = {
        "--scheduler=" + scheduler_.address,
        "--labels=zone=z" + std::to_string(i % 2)};
    worker_flags.insert(worker_flags.end(), extra_worker_flags_.begin(),
                        extra_worker_flags_.end());
    auto w = StartWorker(worker_flags);
    ASSERT_TRUE(w.ok()) << w.status();
    workers_.push_back(std::move(*w));
  }
  ASSERT_TRUE(WaitForWorkers(3, v1::WORKER_STATE_IDLE));
}

v1::ListWorkersResponse SchedulerTest::ListWorkers() {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  v1::ListWorkersResponse r;
  (void)scheduler_.stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &r);
  return r;
}

bool SchedulerTest::WaitForWorkers(int n, v1::WorkerState state,
                                   double timeout_s) {
  const auto deadline = After(timeout_s);
  while (Clock::now() < deadline) {
    int count = 0;
    const v1::ListWorkersResponse listed = ListWorkers();
    for (const auto& w : listed.workers()) count += w.state() == state;
    if (count >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

v1::Job SchedulerTest::GetJob(const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  v1::GetJobRequest q;
  q.set_job_id(id);
  v1::Job job;
  (void)scheduler_.stub->GetJob(&ctx, q, &job);
  return job;
}

v1::Job SchedulerTest::WaitForState(const std::string& id, v1::JobState want,
                                    double timeout_s) {
  const auto deadline = After(timeout_s);
  v1::Job job;
  while (Clock::now() < deadline) {
    job = GetJob(id);
    if (job.state() == want || job.state() == v1::JOB_STATE_FAILED) return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return job;
}

bool SchedulerTest::WaitForStep(const std::string& id, int64_t step,
                                double timeout_s) {
  const auto deadline = After(timeout_s);
  while (Clock::now() < deadline) {
    const v1::Job job = GetJob(id);
    if (job.step() >= step) return true;
    if (job.state() != v1::JOB_STATE_RUNNING &&
        job.state() != v1::JOB_STATE_PLANNING &&
        job.state() != v1::JOB_STATE_PENDING) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

v1::Job SchedulerTest::Submit(const v1::JobSpec& spec) {
  v1::SubmitJobRequest q;
  *q.mutable_spec() = spec;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  v1::Job job;
  const grpc::Status s = scheduler_.stub->SubmitJob(&ctx, q, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job;
}

v1::Plan SchedulerTest::GetPlan(const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  v1::GetPlanRequest q;
  q.set_job_id(id);
  v1::Plan plan;
  const grpc::Status s = scheduler_.stub->GetPlan(&ctx, q, &plan);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return plan;
}

Worker* SchedulerTest::WorkerAt(const std::string& address) {
  for (Worker& w : workers_) {
    if (w.address == address) return &w;
  }
  return nullptr;
}

void SchedulerTest::AddWorker(const std::string& zone) {
  std::vector<std::string> flags = {"--scheduler=" + scheduler_.address,
                                    "--labels=zone=" + zone};
  flags.insert(flags.end(), extra_worker_flags_.begin(),
               extra_worker_flags_.end());
  auto w = StartWorker(flags);
  ASSERT_TRUE(w.ok()) << w.status();
  workers_.push_back(std::move(*w));
}

std::vector<std::vector<float>> SchedulerTest::JobWeights(
    const std::string& job) {
  std::vector<std::pair<int, std::vector<float>>> by_layer;
  const v1::Plan plan = GetPlan(job);
  for (const v1::PlannedStage& s : plan.stages()) {
    Worker* worker = WorkerAt(s.worker_address());
    EXPECT_NE(worker, nullptr) << s.worker_address();
    if (worker == nullptr) return {};
    v1::GetWeightsRequest request;
    request.set_job_id(job);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    v1::GetWeightsResponse response;
    const grpc::Status got = worker->stub->GetWeights(&ctx, request, &response);
    EXPECT_TRUE(got.ok()) << got.error_message();
    for (const auto& t : response.weights()) {
      const std::vector<std::string> parts = absl::StrSplit(t.name(), '.');
      int layer = -1;
      EXPECT_TRUE(parts.size() >= 2 && absl::SimpleAtoi(parts[1], &layer))
          << t.name();
      const float* f = reinterpret_cast<const float*>(t.data().data());
      by_layer.emplace_back(
          layer, std::vector<float>(f, f + t.data().size() / sizeof(float)));
    }
  }
  std::stable_sort(
      by_layer.begin(), by_layer.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<float>> out;
  for (auto& [layer, w] : by_layer) out.push_back(std::move(w));
  return out;
}

v1::ListCheckpointsResponse SchedulerTest::WaitForCheckpoint(
    const std::string& job, double timeout_s, int at_least) {
  const auto deadline = After(timeout_s);
  v1::ListCheckpointsResponse out;
  while (Clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    v1::ListCheckpointsRequest q;
    q.set_job_id(job);
    out.Clear();
    (void)scheduler_.stub->ListCheckpoints(&ctx, q, &out);
    if (out.checkpoints_size() >= at_least) return out;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return out;
}

void SchedulerTest::RestartScheduler() {
  const std::string port =
      scheduler_.address.substr(scheduler_.address.rfind(':') + 1);
  if (scheduler_.process != nullptr && scheduler_.process->Running()) {
    scheduler_.process->Signal(SIGKILL);
  }
  scheduler_ = Scheduler();
  std::vector<std::string> flags = SchedulerFlags();
  flags.insert(flags.end(), extra_scheduler_flags_.begin(),
               extra_scheduler_flags_.end());
  flags.push_back("--listen=127.0.0.1:" + port);
  auto s = StartScheduler(dir_.path(), flags);
  ASSERT_TRUE(s.ok()) << s.status();
  scheduler_ = std::move(*s);
}

}  // namespace pipetrain::testing
