// bench_control: the scheduler's control API under load. A scheduler and
// three workers on loopback finish one small Fashion-MNIST job; then 100
// closed-loop clients call GetJob(job) and ListWorkers alternately for
// PIPETRAIN_BENCH_SECONDS (default 10) over gRPC, then the same calls over
// REST (GET /v1/jobs/{id}, GET /v1/workers; one connection per request).
//
// gRPC clients are callback-API state machines: each keeps one call in
// flight and starts the next from the previous one's completion, so 100
// calls stay in flight on gRPC's own few threads, spread over 4 channels
// (4 TCP connections). Measured beside 100 threads with synchronous stubs
// on the 2-core box: about 25% more calls/s for half the client CPU per
// call (the sync threads had the lower p99, ~9 vs ~14 ms). REST uses 100
// threads with httplib::Client (test_http_client, Connection: close).
// Latency is per call, from issue to completion; an error is a failed call
// or a response without the expected job / workers. Scheduler and bench CPU
// time per wall second show who saturates the (shared) cores.
//
// Last line: {"bench":"control", ...}.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_env.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/process_util.h"
#include "tests/cluster_harness.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;
using Stub = v1::SchedulerService::Stub;

constexpr int kClients = 100;
constexpr int kChannels = 4;
constexpr int kWorkers = 3;
constexpr double kCallDeadlineSeconds = 5;
constexpr int kJobSteps = 5;
constexpr double kJobTimeoutSeconds = 180;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// PIPETRAIN_BENCH_SECONDS, default 10.
double LoadSeconds() {
  return PositiveEnvDouble("PIPETRAIN_BENCH_SECONDS", 10);
}

// ---- Children and temp dirs go with the bench, also on SIGINT/SIGTERM ----

// Thread-safe. What the interrupt thread cleans up before it exits.
struct Leftovers {
  absl::Mutex mu;
  std::vector<pid_t> pids ABSL_GUARDED_BY(mu);
  std::vector<std::string> dirs ABSL_GUARDED_BY(mu);
};
// Never destroyed: the interrupt thread may use it while main returns.
Leftovers& TheLeftovers() {
  static Leftovers* leftovers = new Leftovers();
  return *leftovers;
}

void RememberDir(const std::string& dir) {
  Leftovers& l = TheLeftovers();
  absl::MutexLock lock(&l.mu);
  l.dirs.push_back(dir);
}

// The child and the directory of its port and log files.
void RememberChild(const testing::ChildProcess& child) {
  const std::string& log = child.log_path();
  RememberDir(log.substr(0, log.rfind('/')));
  Leftovers& l = TheLeftovers();
  absl::MutexLock lock(&l.mu);
  l.pids.push_back(child.pid());
}

// Blocks SIGINT and SIGTERM in this and every later thread and starts one
// that waits for them, kills the children, removes the dirs and exits.
// Call before any other thread exists.
void ReapOnInterrupt() {
  BlockShutdownSignals();
  std::thread([] {
    const int signal = WaitForShutdownSignal();
    Leftovers& l = TheLeftovers();
    absl::MutexLock lock(&l.mu);
    for (pid_t pid : l.pids) kill(pid, SIGKILL);
    for (pid_t pid : l.pids) waitpid(pid, nullptr, 0);
    for (const std::string& dir : l.dirs) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
    _exit(128 + signal);
  }).detach();
}

// ---- Setup ----

struct Cluster {
  testing::Scheduler scheduler;
  std::vector<testing::Worker> workers;  // destroyed (killed) first
};

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kCallDeadlineSeconds));
  v1::ListWorkersResponse r;
  RETURN_IF_ERROR(FromGrpcStatus(stub->ListWorkers(&ctx, {}, &r)));
  return r;
}

int CountInState(const v1::ListWorkersResponse& listed, v1::WorkerState s) {
  return static_cast<int>(
      std::count_if(listed.workers().begin(), listed.workers().end(),
                    [s](const v1::WorkerInfo& w) { return w.state() == s; }));
}

absl::Status AwaitIdleWorkers(Stub* stub, double timeout_s) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(int(timeout_s * 1000));
  while (Clock::now() < deadline) {
    absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers(stub);
    if (listed.ok() &&
        CountInState(*listed, v1::WORKER_STATE_IDLE) >= kWorkers) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError("the workers did not turn IDLE in time");
}

absl::Status StartCluster(const std::string& data_dir, Cluster* cluster) {
  ASSIGN_OR_RETURN(cluster->scheduler, testing::StartScheduler(data_dir));
  RememberChild(*cluster->scheduler.process);
  for (int i = 0; i < kWorkers; ++i) {
    ASSIGN_OR_RETURN(
        testing::Worker w,
        testing::StartWorker({"--scheduler=" + cluster->scheduler.address}));
    RememberChild(*w.process);
    cluster->workers.push_back(std::move(w));
  }
  return AwaitIdleWorkers(cluster->scheduler.stub.get(), 30);
}

absl::StatusOr<v1::Job> GetJob(Stub* stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kCallDeadlineSeconds));
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  RETURN_IF_ERROR(FromGrpcStatus(stub->GetJob(&ctx, request, &job)));
  return job;
}

// Submits the example MLP for a few steps and waits until it completes.
absl::StatusOr<v1::Job> RunOneJob(Stub* stub) {
  v1::SubmitJobRequest request;
  v1::JobSpec* spec = request.mutable_spec();
  RETURN_IF_ERROR(
      ReadJsonFile(testing::SourcePath("examples/fashion_mnist_mlp.job.json"),
                   spec->mutable_training()));
  spec->mutable_training()->set_steps(kJobSteps);
  spec->mutable_training()->set_epochs(0);
  spec->set_num_stages(kWorkers);
  spec->set_eval_samples(1000);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(30));
  v1::Job job;
  RETURN_IF_ERROR(FromGrpcStatus(stub->SubmitJob(&ctx, request, &job)));
  const Clock::time_point deadline =
      Clock::now() + std::chrono::seconds(int(kJobTimeoutSeconds));
  while (Clock::now() < deadline) {
    ASSIGN_OR_RETURN(job, GetJob(stub, job.id()));
    if (job.state() == v1::JOB_STATE_COMPLETED) return job;
    if (job.state() == v1::JOB_STATE_FAILED ||
        job.state() == v1::JOB_STATE_CANCELLED) {
      return absl::AbortedError(absl::StrCat(job.id(), " ended ",
                                             v1::JobState_Name(job.state()),
                                             ": ", job.error()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(job.id() + " did not complete in time");
}

// ---- Measurement ----

// One client's record. Not thread-safe: written by whichever thread runs
// that client's single call in flight.
struct ClientLog {
  std::vector<double> latencies_ms;
  int64_t errors = 0;

  void Record(Clock::time_point start, bool ok) {
    latencies_ms.push_back(Seconds(Clock::now() - start) * 1e3);
    errors += !ok;
  }
};

struct LoadResult {
  std::vector<double> latencies_ms;  // every finished call, sorted
  int64_t errors = 0;
  double seconds = 0;  // first issue to last completion
  double scheduler_cpu_cores = 0;
  double bench_cpu_cores = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  double calls_per_s() const { return latencies_ms.size() / seconds; }
};

LoadResult Merge(const std::vector<ClientLog>& logs, double seconds) {
  LoadResult r;
  for (const ClientLog& log : logs) {
    r.latencies_ms.insert(r.latencies_ms.end(), log.latencies_ms.begin(),
                          log.latencies_ms.end());
    r.errors += log.errors;
  }
  r.seconds = seconds;
  std::sort(r.latencies_ms.begin(), r.latencies_ms.end());
  const size_t n = r.latencies_ms.size();
  if (n == 0) return r;
  r.p50_ms = r.latencies_ms[n / 2];
  r.p99_ms = r.latencies_ms[std::min(n - 1, n * 99 / 100)];
  r.max_ms = r.latencies_ms.back();
  return r;
}

// User + system CPU seconds of a process, from /proc/<pid>/stat.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  double utime = 0, stime = 0;
  // After "(comm) ", field 3 (state) comes first; utime is 14, stime 15.
  for (int i = 3; i <= 15 && (fields >> field); ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

// Runs `load` (which returns its result) and adds CPU use per wall second.
LoadResult Measure(pid_t scheduler, const std::function<LoadResult()>& load) {
  const double server0 = CpuSeconds(scheduler), bench0 = CpuSeconds(getpid());
  LoadResult r = load();
  r.scheduler_cpu_cores = (CpuSeconds(scheduler) - server0) / r.seconds;
  r.bench_cpu_cores = (CpuSeconds(getpid()) - bench0) / r.seconds;
  return r;
}

// ---- gRPC load ----

// Counts running clients down; Wait returns when none is left.
class Latch {
 public:
  explicit Latch(int n) : n_(n) {}
  void CountDown() {
    absl::MutexLock lock(&mu_);
    --n_;
  }
  void Wait() {
    absl::MutexLock lock(&mu_);
    auto zero = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ == 0; };
    mu_.Await(absl::Condition(&zero));
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_);
};

// A closed-loop client on the callback API: one call in flight, the next
// started from the previous one's completion callback (which never blocks)
// until `end`. Not thread-safe; its calls are sequential by construction.
class CallbackClient {
 public:
  CallbackClient(Stub* stub, const std::string& job_id, Clock::time_point end,
                 Latch* done)
      : stub_(stub), end_(end), done_(done) {
    get_job_.set_job_id(job_id);
  }
  void Start() { Issue(); }
  const ClientLog& log() const { return log_; }

 private:
  void Issue() {
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_deadline(DeadlineIn(kCallDeadlineSeconds));
    start_ = Clock::now();
    const bool get_job = (++calls_ % 2) == 1;
    if (get_job) {
      stub_->async()->GetJob(context_.get(), &get_job_, &job_,
                             [this](grpc::Status s) {
                               OnDone(s.ok() && job_.id() == get_job_.job_id());
                             });
    } else {
      stub_->async()->ListWorkers(
          context_.get(), &list_workers_, &workers_, [this](grpc::Status s) {
            OnDone(s.ok() && workers_.workers_size() == kWorkers);
          });
    }
  }
  void OnDone(bool ok) {
    log_.Record(start_, ok);
    if (Clock::now() < end_) return Issue();
    done_->CountDown();
  }

  Stub* const stub_;  // borrowed
  const Clock::time_point end_;
  Latch* const done_;  // borrowed
  v1::GetJobRequest get_job_;
  v1::ListWorkersRequest list_workers_;
  v1::Job job_;
  v1::ListWorkersResponse workers_;
  std::unique_ptr<grpc::ClientContext> context_;
  Clock::time_point start_;
  int64_t calls_ = 0;
  ClientLog log_;
};

// kChannels stubs, each on its own TCP connection (a channel-local
// subchannel pool keeps gRPC from sharing one connection among them).
std::vector<std::unique_ptr<Stub>> ConnectStubs(const std::string& address) {
  std::vector<std::unique_ptr<Stub>> stubs;
  for (int i = 0; i < kChannels; ++i) {
    grpc::ChannelArguments args = DefaultChannelArguments();
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
    channel->WaitForConnected(DeadlineIn(kCallDeadlineSeconds));
    stubs.push_back(v1::SchedulerService::NewStub(channel));
  }
  return stubs;
}

LoadResult RunGrpcLoad(const std::string& address, const std::string& job_id,
                       double seconds) {
  std::vector<std::unique_ptr<Stub>> stubs = ConnectStubs(address);
  const Clock::time_point start = Clock::now();
  const Clock::time_point end =
      start + std::chrono::microseconds(int64_t(seconds * 1e6));
  Latch done(kClients);
  std::vector<std::unique_ptr<CallbackClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<CallbackClient>(
        stubs[i % kChannels].get(), job_id, end, &done));
  }
  for (auto& client : clients) client->Start();
  done.Wait();
  const double elapsed = Seconds(Clock::now() - start);
  std::vector<ClientLog> logs;
  for (auto& client : clients) logs.push_back(client->log());
  return Merge(logs, elapsed);
}

// ---- REST load ----

void RestClient(int port, const std::string& job_id, Clock::time_point end,
                ClientLog* log) {
  const std::string job_path = "/v1/jobs/" + job_id;
  for (bool get_job = true; Clock::now() < end; get_job = !get_job) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<testing_http::ClientResponse> r = testing_http::Send(
        port, "GET", get_job ? job_path : std::string("/v1/workers"));
    const bool ok =
        r.ok() && r->status == 200 &&
        r->body.find(get_job ? job_id : "workers") != std::string::npos;
    log->Record(start, ok);
  }
}

LoadResult RunRestLoad(int port, const std::string& job_id, double seconds) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point end =
      start + std::chrono::microseconds(int64_t(seconds * 1e6));
  std::vector<ClientLog> logs(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back(RestClient, port, job_id, end, &logs[i]);
  }
  for (std::thread& t : threads) t.join();
  return Merge(logs, Seconds(Clock::now() - start));
}

// ---- Server-side view ----

// Scheduler-side handler time per method for one transport, summed from
// /metrics (pipetrain_scheduler_control_call_seconds _sum and _count).
struct HandlerTime {
  double seconds = 0;
  double calls = 0;
};
using HandlerTimes = std::map<std::string, HandlerTime>;

HandlerTimes ScrapeHandlerTimes(int http_port, const std::string& transport) {
  HandlerTimes out;
  auto r = testing_http::Send(http_port, "GET", "/metrics");
  if (!r.ok()) return out;
  std::istringstream lines(r->body);
  const std::string prefix = "pipetrain_scheduler_control_call_seconds_";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0 ||
        line.find("transport=\"" + transport + "\"") == std::string::npos) {
      continue;
    }
    const size_t m = line.find("method=\"");
    const size_t space = line.rfind(' ');
    double value = 0;
    if (m == std::string::npos || space == std::string::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      continue;
    }
    const std::string method =
        line.substr(m + 8, line.find('"', m + 8) - (m + 8));
    const bool sum = line.compare(prefix.size(), 4, "sum{") == 0;
    const bool count = line.compare(prefix.size(), 6, "count{") == 0;
    if (sum) out[method].seconds = value;
    if (count) out[method].calls = value;
  }
  return out;
}

std::string DescribeHandlerTimes(const HandlerTimes& before,
                                 const HandlerTimes& after) {
  std::string out;
  for (const auto& [method, t] : after) {
    const HandlerTime b =
        before.count(method) ? before.at(method) : HandlerTime();
    const double calls = t.calls - b.calls;
    if (calls <= 0) continue;
    absl::StrAppendFormat(&out, " %s %.0f calls, mean %.3f ms;", method, calls,
                          (t.seconds - b.seconds) / calls * 1e3);
  }
  return out;
}

// ---- Report ----

void PrintResult(const char* name, const char* design, const LoadResult& r,
                 const std::string& handler_times) {
  std::printf(
      "%s (%s): %zu calls in %.2f s = %.0f calls/s; latency p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms; errors %ld; CPU: scheduler %.2f cores, "
      "bench %.2f cores\n  in the scheduler's handlers:%s\n",
      name, design, r.latencies_ms.size(), r.seconds, r.calls_per_s(), r.p50_ms,
      r.p99_ms, r.max_ms, static_cast<long>(r.errors), r.scheduler_cpu_cores,
      r.bench_cpu_cores, handler_times.c_str());
}

// Runs one transport's load with CPU and handler-time accounting.
LoadResult RunPhase(const Cluster& cluster, const char* transport,
                    const char* design,
                    const std::function<LoadResult()>& load) {
  const int http = cluster.scheduler.http_port;
  const HandlerTimes before = ScrapeHandlerTimes(http, transport);
  LoadResult r = Measure(cluster.scheduler.process->pid(), load);
  PrintResult(
      transport, design, r,
      DescribeHandlerTimes(before, ScrapeHandlerTimes(http, transport)));
  std::fflush(stdout);
  return r;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench_control: %s\n", status.ToString().c_str());
  return 1;
}

// Starts the cluster, finishes the job and says so; the job to query.
absl::StatusOr<v1::Job> SetUp(const std::string& data_dir, Cluster* cluster) {
  const Clock::time_point start = Clock::now();
  RETURN_IF_ERROR(StartCluster(data_dir, cluster));
  ASSIGN_OR_RETURN(v1::Job job, RunOneJob(cluster->scheduler.stub.get()));
  std::printf(
      "setup: scheduler %s (REST port %d), %d workers IDLE, %s %s after %ld "
      "steps, loss %.4f; %.1f s\n",
      cluster->scheduler.address.c_str(), cluster->scheduler.http_port,
      kWorkers, job.id().c_str(), v1::JobState_Name(job.state()).c_str(),
      static_cast<long>(job.step()), job.loss(), Seconds(Clock::now() - start));
  return job;
}

void PrintJson(const LoadResult& grpc_load, const LoadResult& rest_load) {
  std::printf(
      "%s\n",
      absl::StrFormat(
          "{\"bench\":\"control\",\"grpc_calls_per_s\":%.1f,"
          "\"grpc_p50_ms\":%.3f,\"grpc_p99_ms\":%.3f,\"grpc_max_ms\":%.3f,"
          "\"rest_calls_per_s\":%.1f,\"rest_p50_ms\":%.3f,"
          "\"rest_p99_ms\":%.3f,\"rest_max_ms\":%.3f,\"grpc_errors\":%d,"
          "\"rest_errors\":%d,\"errors\":%d}",
          grpc_load.calls_per_s(), grpc_load.p50_ms, grpc_load.p99_ms,
          grpc_load.max_ms, rest_load.calls_per_s(), rest_load.p50_ms,
          rest_load.p99_ms, rest_load.max_ms, grpc_load.errors,
          rest_load.errors, grpc_load.errors + rest_load.errors)
          .c_str());
}

int Main() {
  ReapOnInterrupt();
  const double seconds = LoadSeconds();
  testing::TempDir dir;  // outlives the cluster
  if (dir.path().empty()) return Fail(absl::InternalError("no temp dir"));
  RememberDir(dir.path());
  Cluster cluster;
  absl::StatusOr<v1::Job> job = SetUp(dir.path(), &cluster);
  if (!job.ok()) return Fail(job.status());
  std::printf(
      "load: %d clients, GetJob(%s) and ListWorkers alternately, %.0f s per "
      "transport, %.0f s deadline per call\n",
      kClients, job->id().c_str(), seconds, kCallDeadlineSeconds);
  std::fflush(stdout);
  const LoadResult grpc_load = RunPhase(
      cluster, "grpc", "callback API, 100 calls in flight on 4 channels", [&] {
        return RunGrpcLoad(cluster.scheduler.address, job->id(), seconds);
      });
  const LoadResult rest_load =
      RunPhase(cluster, "rest", "100 threads, one connection per call", [&] {
        return RunRestLoad(cluster.scheduler.http_port, job->id(), seconds);
      });
  // The scheduler must have survived the load (and kept its workers).
  absl::StatusOr<v1::ListWorkersResponse> after =
      ListWorkers(cluster.scheduler.stub.get());
  if (!after.ok()) return Fail(after.status());
  std::printf("workers after the load: %d IDLE, %d LOST\n",
              CountInState(*after, v1::WORKER_STATE_IDLE),
              CountInState(*after, v1::WORKER_STATE_LOST));
  PrintJson(grpc_load, rest_load);
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
