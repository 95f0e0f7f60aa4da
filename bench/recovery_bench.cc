// bench_recovery: what surviving failures costs, on the MLP of the pipeline
// benchmark (784-2048-2048-2048-10, batch 256, M = 8) trained by a
// scheduler and worker processes (one BLAS thread each) on loopback with
// GPipe on 3 stages.
//
// checkpoint_overhead: the training time lost per checkpoint as a fraction
// of the time between checkpoints at checkpointEvery = 100. One cluster
// trains the job with checkpoints off (-1) and at every 100 steps, side by
// side, alternating which goes first; each run times steps [50, 150) on
// the last stage (its next_step polled every 5 ms), a window holding the
// one checkpoint at step 100 (the snapshot at the boundary and the
// background fetch and write that follow it). overhead = (on - off) / off,
// per repetition; the median over PIPETRAIN_BENCH_REPS (default 3).
//
// recovery_seconds / replan_recovery_seconds: a fresh cluster (default 3 s
// lease, 0.5 s heartbeat) with a spare worker, or without one, trains the
// job checkpointing every 10 steps; once a checkpoint is committed the
// worker of stage 1 is SIGKILLed. The time runs from the kill to the
// scheduler's "recovered" event (the first step the last stage completed
// after the resume, as its heartbeat reported it; up to one heartbeat
// late). It includes the lease the scheduler waits before it calls the
// worker lost. Medians and ranges over the repetitions.
//
// Last line: {"bench":"recovery", ...}.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_env.h"
#include "bench/bench_models.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"
#include "tests/cluster_harness.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStages = 3;
constexpr int64_t kCheckpointEvery = 100;
constexpr int64_t kWindowBegin = 50;
constexpr int64_t kWindowEnd = 150;
constexpr int64_t kRecoveryCheckpointEvery = 10;
constexpr int64_t kRecoverySteps = 100000;  // cancelled once recovered
constexpr double kTimeoutSeconds = 900;

int Reps() {
  return static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_REPS", 3));
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

// A scheduler with a data directory (checkpoints on) and `workers` stage
// workers with one BLAS thread each. Children are killed with the object.
struct Cluster {
  testing::TempDir dir;
  testing::Scheduler scheduler;
  std::vector<testing::Worker> workers;

  absl::Status Start(int n) {
    ASSIGN_OR_RETURN(scheduler, testing::StartScheduler(dir.path()));
    for (int i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(
          testing::Worker w,
          testing::StartWorker(
              {"--threads=1", "--scheduler=" + scheduler.address}));
      workers.push_back(std::move(w));
    }
    return WaitForIdle(n);
  }

  absl::Status WaitForIdle(int n) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(5));
      v1::ListWorkersResponse out;
      int idle = 0;
      if (scheduler.stub->ListWorkers(&ctx, {}, &out).ok()) {
        for (const auto& w : out.workers()) {
          idle += w.state() == v1::WORKER_STATE_IDLE;
        }
      }
      if (idle >= n) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::DeadlineExceededError("workers did not come up");
  }

  absl::StatusOr<v1::Job> Submit(int64_t steps, int64_t checkpoint_every) {
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    *spec->mutable_training() = WideMlpJob(steps);
    spec->mutable_training()->set_checkpoint_every(checkpoint_every);
    spec->set_num_stages(kStages);
    spec->set_schedule(v1::SCHEDULE_GPIPE);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    v1::Job job;
    RETURN_IF_ERROR(
        FromGrpcStatus(scheduler.stub->SubmitJob(&ctx, request, &job)));
    return job;
  }

  absl::StatusOr<v1::Job> Get(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(10));
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    RETURN_IF_ERROR(
        FromGrpcStatus(scheduler.stub->GetJob(&ctx, request, &job)));
    return job;
  }

  absl::StatusOr<v1::Plan> Plan(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(10));
    v1::GetPlanRequest request;
    request.set_job_id(id);
    v1::Plan plan;
    RETURN_IF_ERROR(
        FromGrpcStatus(scheduler.stub->GetPlan(&ctx, request, &plan)));
    return plan;
  }

  // Waits for `id` to reach `state`; an error when it failed.
  absl::Status WaitFor(const std::string& id, v1::JobState state) {
    const auto deadline =
        Clock::now() + std::chrono::seconds(static_cast<int>(kTimeoutSeconds));
    while (Clock::now() < deadline) {
      ASSIGN_OR_RETURN(v1::Job job, Get(id));
      if (job.state() == state) return absl::OkStatus();
      if (job.state() == v1::JOB_STATE_FAILED) {
        return absl::AbortedError(absl::StrCat(id, " failed: ", job.error()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat(id, " timed out"));
  }

  testing::Worker* At(const std::string& address) {
    for (testing::Worker& w : workers) {
      if (w.address == address) return &w;
    }
    return nullptr;
  }
};

// Where the window's time went on the last stage: the sum of its steps'
// own durations, and the slowest step (a pause at the checkpoint shows
// there; a general slowdown in the sum).
void PrintStepTimes(testing::Worker& last, const std::string& job) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  v1::GetStatusRequest request;
  request.set_job_id(job);
  request.set_results_since(kWindowBegin);
  v1::GetStatusResponse status;
  if (!last.stub->GetStatus(&ctx, request, &status).ok()) return;
  double sum = 0, slowest = 0, before = 0;
  int64_t slowest_step = -1, n = 0;
  for (const v1::StepResult& r : status.results()) {
    if (r.step() < kWindowBegin || r.step() >= kWindowEnd) continue;
    sum += r.seconds();
    if (r.step() < kCheckpointEvery) before += r.seconds();
    ++n;
    if (r.seconds() > slowest) {
      slowest = r.seconds();
      slowest_step = r.step();
    }
  }
  std::printf(
      "    last stage: %lld steps of the window sum to %.2f s (%.2f s before "
      "step %lld, %.2f s from it on); slowest step %lld took %.2f s\n",
      static_cast<long long>(n), sum, before,
      static_cast<long long>(kCheckpointEvery), sum - before,
      static_cast<long long>(slowest_step), slowest);
}

// Seconds the last stage of `job` takes for steps [kWindowBegin,
// kWindowEnd), from its next_step polled every 5 ms.
absl::StatusOr<double> WindowSeconds(Cluster& c, const std::string& job) {
  RETURN_IF_ERROR(c.WaitFor(job, v1::JOB_STATE_RUNNING));
  ASSIGN_OR_RETURN(v1::Plan plan, c.Plan(job));
  testing::Worker* last = c.At(plan.stages(kStages - 1).worker_address());
  if (last == nullptr) return absl::InternalError("no last stage worker");
  std::optional<Clock::time_point> begin;
  const auto deadline =
      Clock::now() + std::chrono::seconds(static_cast<int>(kTimeoutSeconds));
  while (Clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    v1::GetStatusRequest request;
    request.set_job_id(job);
    v1::GetStatusResponse status;
    RETURN_IF_ERROR(
        FromGrpcStatus(last->stub->GetStatus(&ctx, request, &status)));
    const auto now = Clock::now();
    if (!begin.has_value() && status.next_step() >= kWindowBegin) begin = now;
    if (status.next_step() >= kWindowEnd) {
      if (!begin.has_value()) return absl::InternalError("window missed");
      PrintStepTimes(*last, job);
      return std::chrono::duration<double>(now - *begin).count();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::DeadlineExceededError("the window did not end");
}

absl::StatusOr<double> TimedRun(Cluster& c, int64_t checkpoint_every) {
  ASSIGN_OR_RETURN(v1::Job job, c.Submit(kWindowEnd + 1, checkpoint_every));
  ASSIGN_OR_RETURN(double seconds, WindowSeconds(c, job.id()));
  RETURN_IF_ERROR(c.WaitFor(job.id(), v1::JOB_STATE_COMPLETED));
  std::printf("  checkpointEvery %3lld: steps [%lld, %lld) in %.2f s",
              static_cast<long long>(checkpoint_every),
              static_cast<long long>(kWindowBegin),
              static_cast<long long>(kWindowEnd), seconds);
  // What the checkpoint cost the scheduler (fetch from the stages, write,
  // commit), beside the training time it cost.
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  v1::ListCheckpointsRequest request;
  request.set_job_id(job.id());
  v1::ListCheckpointsResponse list;
  if (c.scheduler.stub->ListCheckpoints(&ctx, request, &list).ok()) {
    for (const v1::CheckpointInfo& info : list.checkpoints()) {
      std::printf(
          "; checkpoint at step %lld: %.1f MiB fetched and written in "
          "%.2f s",
          static_cast<long long>(info.step()), info.bytes() / 1048576.0,
          info.write_seconds());
    }
  }
  std::printf("\n");
  std::fflush(stdout);
  return seconds;
}

absl::StatusOr<std::vector<double>> Overheads(int reps) {
  Cluster c;
  RETURN_IF_ERROR(c.Start(kStages));
  std::vector<double> out;
  for (int r = 0; r < reps; ++r) {
    double off = 0, on = 0;
    if (r % 2 == 0) {
      ASSIGN_OR_RETURN(off, TimedRun(c, -1));
      ASSIGN_OR_RETURN(on, TimedRun(c, kCheckpointEvery));
    } else {
      ASSIGN_OR_RETURN(on, TimedRun(c, kCheckpointEvery));
      ASSIGN_OR_RETURN(off, TimedRun(c, -1));
    }
    out.push_back((on - off) / off);
    std::printf("overhead %d: %.4f\n", r, out.back());
  }
  return out;
}

// Seconds from SIGKILL of stage 1's worker to the "recovered" event.
absl::StatusOr<double> Recovery(bool spare) {
  Cluster c;
  RETURN_IF_ERROR(c.Start(kStages + (spare ? 1 : 0)));
  ASSIGN_OR_RETURN(v1::Job job,
                   c.Submit(kRecoverySteps, kRecoveryCheckpointEvery));
  RETURN_IF_ERROR(c.WaitFor(job.id(), v1::JOB_STATE_RUNNING));
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  for (;;) {
    if (Clock::now() > deadline) return absl::DeadlineExceededError("no ckpt");
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    v1::ListCheckpointsRequest request;
    request.set_job_id(job.id());
    v1::ListCheckpointsResponse list;
    if (c.scheduler.stub->ListCheckpoints(&ctx, request, &list).ok() &&
        list.checkpoints_size() > 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSIGN_OR_RETURN(v1::Plan plan, c.Plan(job.id()));
  testing::Worker* victim = c.At(plan.stages(1).worker_address());
  if (victim == nullptr) return absl::InternalError("no stage 1 worker");
  const int64_t killed_ms = UnixMs();
  victim->process->Signal(SIGKILL);
  while (Clock::now() < deadline) {
    ASSIGN_OR_RETURN(v1::Job now, c.Get(job.id()));
    for (const v1::JobEvent& e : now.events()) {
      if (e.kind() != v1::JOB_EVENT_RECOVERED) continue;
      const double seconds = (e.unix_ms() - killed_ms) / 1000.0;
      ASSIGN_OR_RETURN(v1::Plan after, c.Plan(job.id()));
      std::printf(
          "  %s: %.2f s from the kill to the next step on %d stages (the "
          "scheduler counts %.2f s from the loss being seen)\n",
          spare ? "spare" : "re-plan", seconds, after.stages_size(),
          e.seconds());
      std::fflush(stdout);
      return seconds;
    }
    if (now.state() == v1::JOB_STATE_FAILED) {
      return absl::AbortedError(absl::StrCat("job failed: ", now.error()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("no recovery");
}

absl::StatusOr<std::vector<double>> Recoveries(bool spare, int reps) {
  std::vector<double> out;
  for (int r = 0; r < reps; ++r) {
    ASSIGN_OR_RETURN(double s, Recovery(spare));
    out.push_back(s);
  }
  return out;
}

int Main() {
  const int reps = Reps();
  std::printf("checkpoint overhead (%d repetitions, checkpointEvery %lld):\n",
              reps, static_cast<long long>(kCheckpointEvery));
  absl::StatusOr<std::vector<double>> overheads = Overheads(reps);
  if (!overheads.ok()) {
    std::fprintf(stderr, "overhead: %s\n",
                 overheads.status().ToString().c_str());
    return 1;
  }
  std::printf("recovery with a spare, then by re-planning:\n");
  absl::StatusOr<std::vector<double>> spare = Recoveries(true, reps);
  absl::StatusOr<std::vector<double>> replan =
      spare.ok() ? Recoveries(false, reps) : spare.status();
  if (!replan.ok()) {
    std::fprintf(stderr, "recovery: %s\n", replan.status().ToString().c_str());
    return 1;
  }
  const Stats o = Summarize(*overheads);
  const Stats s = Summarize(*spare);
  const Stats p = Summarize(*replan);
  std::printf(
      "checkpoint_overhead %.4f (range %.4f to %.4f; goal < 0.05); "
      "recovery_seconds %.2f (%.2f to %.2f; goal < 10); "
      "replan_recovery_seconds %.2f (%.2f to %.2f)\n",
      o.median, o.min, o.max, s.median, s.min, s.max, p.median, p.min, p.max);
  std::printf(
      "%s\n",
      absl::StrFormat(
          "{\"bench\":\"recovery\",\"repetitions\":%d,"
          "\"checkpoint_every\":%d,\"checkpoint_overhead\":%.4f,"
          "\"checkpoint_overhead_min\":%.4f,\"checkpoint_overhead_max\":%.4f,"
          "\"recovery_seconds\":%.3f,\"recovery_seconds_min\":%.3f,"
          "\"recovery_seconds_max\":%.3f,\"replan_recovery_seconds\":%.3f,"
          "\"replan_recovery_seconds_min\":%.3f,"
          "\"replan_recovery_seconds_max\":%.3f}",
          reps, kCheckpointEvery, o.median, o.min, o.max, s.median, s.min,
          s.max, p.median, p.min, p.max)
          .c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
