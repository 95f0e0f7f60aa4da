// bench_scaling: how close a pipeline of K = 2 worker processes (one BLAS
// thread each) comes to what the machine can do with the same K cores,
// measured side by side in one run.
//
// Models (balanced): the MLP 784-2048, four 2048x2048 Linear+ReLU blocks,
// 2048-10 (batch 256, SGD), and the character Transformer LM of
// examples/char_transformer.job.json with four equal blocks (its two plus
// two copies; batch 64, no gradient clipping).
//
// Capacity: K in-process trainers (LocalTrainer, one BLAS thread each), each
// on the whole batch as one micro-batch, running at the same time in K
// child processes of this binary (started after their warm-up, together);
// their samples/s summed. Each side's CPU time (user + system, every
// thread: /proc for the workers, getrusage in the children) is printed
// per sample too: on a shared machine the scheduler divides the cores by
// thread, and a worker has more threads (gRPC, transport) than a trainer. For
// reference (not a ratio's denominator) the same K trainers splitting the batch
// into 8 micro-batches are measured too: a smaller working set can run faster
// per sample on one core.
//
// Pipeline: GPipe, 1F1B-flush and ZB-H1 at M = 8 and M = 16 on K = 2
// pipetrain-worker processes, cut where the project's planner puts the
// cut (BuildPlan over the Profile of worker 0 and what the workers measured
// of their own message costs and CPUs, as the scheduler plans a job; the
// links between them are not probed, so the plan takes the topology's
// default for loopback). Capacity and pipeline runs alternate: every repetition
// measures capacity and then each pipeline case, per model; the figures
// are medians over PIPETRAIN_BENCH_REPS repetitions, with their range, and
// each vs_capacity ratio is the median of the per-repetition ratios.
//
// Per stage, where the time went, from the stage's Prometheus counters
// (pipetrain_stage_compute_seconds_total{phase}, idle_seconds_total,
// send_seconds_total), differenced over each stage's own window of whole
// steady-state steps, in ms per step and as a share of the window's wall
// time: forward, backward (a full backward, or B of ZB-H1), the weight
// pass W of ZB-H1, loss, optimizer, pack (packed weights laid out after
// each layer's update or in a wait, see stage_compute.h), sending (handing
// messages to the transport: encoding and queueing), blocked waiting for a
// neighbour's message, and the rest (unattributed: the executor's own work);
// and the worker processes' CPU per sample and the cores they kept busy over
// the window. Blocked time is split in two: idle by schedule, the simulator's
// idle fraction for this schedule with the stage's measured
// per-micro-batch costs (the wait the schedule itself imposes), and
// waiting for input beyond it (transfer and neighbours running late);
// the schedule's theoretical bubble is printed beside them. Per case, the
// schedule ceiling: one minus the stages' mean simulated idle fraction,
// the share of both workers' time the schedule and the cut leave for the
// measured work were nothing else lost (an uneven cut lowers it below one
// minus the bubble); `<schedule>_m<M>_schedule_ceiling` in the JSON.
//
// prediction_error = |predicted - measured| / measured step time, the
// prediction being the plan's predicted_step_seconds.
//
// Packed weights: GPipe and ZB-H1 at M = 8 run a second time, in the same
// repetition, on a second pair of workers started with
// PIPETRAIN_PACKED_GEMM=0 (their CPU backends send every product to
// OpenBLAS instead of reusing a packed copy of each weight for the step's
// micro-batches); `<schedule>_m8_packed_vs_unpacked` is the median of the
// per-repetition ratios of samples/s. Each pair is planned (cut and
// predicted step) on a profile of its own first worker, as the scheduler
// profiles each kind of worker on its own device.
//
// Knobs: PIPETRAIN_BENCH_REPS (3), PIPETRAIN_BENCH_STEPS (measured steps
// per run, 6), PIPETRAIN_BENCH_WARMUP (2), PIPETRAIN_BENCH_MODEL (mlp or
// lm: only that model; both by default), PIPETRAIN_BENCH_TRACE (set: after
// each run, every stage's timeline of two late steps on stderr).
//
// Last line: {"bench":"scaling", "pipeline_vs_capacity": ..., ...}.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/bench_env.h"
#include "bench/bench_models.h"
#include "common/heap_tuning.h"
#include "common/median.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "scheduler/plan_builder.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "services/worker/planner_figures.h"
#include "spec/job_spec.h"
#include "spec/schedule.h"
#include "tests/cluster_harness.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

constexpr int kWorkers = 2;
constexpr char kChildFlag[] = "--capacity_child";

// 784-2048, four 2048x2048 blocks, 2048-10: 11 layers.
v1::TrainingSpec MlpSpec() {
  v1::TrainingSpec spec = WideMlpJob(1);
  v1::ModelSpec* model = spec.mutable_model();
  model->clear_layers();
  const int widths[] = {784, 2048, 2048, 2048, 2048, 2048, 10};
  for (int i = 0; i < 6; ++i) {
    auto* linear = model->add_layers()->mutable_linear();
    linear->set_in_features(widths[i]);
    linear->set_out_features(widths[i + 1]);
    if (i < 5) model->add_layers()->mutable_relu();
  }
  return spec;
}

// The example's LM with four equal blocks: embed, 4 x block, ln_f, head.
absl::StatusOr<v1::TrainingSpec> LmSpec() {
  v1::TrainingSpec spec;
  RETURN_IF_ERROR(ReadJsonFile(
      testing::SourcePath("examples/char_transformer.job.json"), &spec));
  v1::ModelSpec* model = spec.mutable_model();
  int blocks = 0;
  for (const auto& l : model->layers()) blocks += l.has_transformer_block();
  if (blocks != 2 || !model->layers(1).has_transformer_block()) {
    return absl::FailedPreconditionError(
        "examples/char_transformer.job.json: expected 2 blocks after embed");
  }
  v1::ModelSpec four = *model;
  four.clear_layers();
  for (int i = 0; i < model->layers_size(); ++i) {
    *four.add_layers() = model->layers(i);
    if (i == 2) {
      for (int b = 3; b <= 4; ++b) {
        v1::LayerSpec copy = model->layers(1);
        copy.set_name(absl::StrFormat("block%d", b));
        *four.add_layers() = copy;
      }
    }
  }
  *model = four;
  spec.set_batch_size(64);
  spec.mutable_optimizer()->set_clip_grad_norm(0);
  spec.set_eval_every(0);
  return spec;
}

absl::StatusOr<v1::TrainingSpec> ModelSpec(const std::string& name) {
  if (name == "mlp") return MlpSpec();
  if (name == "lm") return LmSpec();
  return absl::InvalidArgumentError("unknown model " + name);
}

// CPU seconds (user + system, all threads) of this process.
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds (user + system, all threads) of process `pid`, or -1.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return -1;
  // After the name: state (field 3) ... utime (14), stime (15).
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  double utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime)) {
    return -1;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// ---- Capacity: one in-process trainer per child process ----

// The child: warm up, say "ready", wait for "go", train `steps` steps on
// one thread, print samples/s.
int CapacityChild(const std::string& model, int micro_batches, int warmup,
                  int steps) {
  auto spec = ModelSpec(model);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  spec->set_micro_batches(micro_batches);
  spec->set_steps(warmup + steps);
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(*spec, backend.get());
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    return 1;
  }
  for (int i = 0; i < warmup; ++i) {
    if (!(*trainer)->Step().ok()) return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char go[8];
  if (std::fgets(go, sizeof(go), stdin) == nullptr ||
      std::strcmp(go, "go\n") != 0) {
    return 1;
  }
  const double cpu_start = SelfCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    if (!(*trainer)->Step().ok()) return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // samples/s, then CPU seconds per sample (all threads, user + system).
  const double samples = static_cast<double>(spec->batch_size()) * steps;
  std::printf("%.6f %.9f\n", samples / seconds,
              (SelfCpuSeconds() - cpu_start) / samples);
  return 0;
}

struct Child {
  pid_t pid = -1;
  FILE* in = nullptr;   // its stdin
  FILE* out = nullptr;  // its stdout
};

struct Capacity {
  double samples_per_s = 0;           // summed over the children
  double cpu_seconds_per_sample = 0;  // their mean
};

// K concurrent children, or an error.
absl::StatusOr<Capacity> MeasureCapacity(const std::string& model,
                                         int micro_batches, int warmup,
                                         int steps) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return absl::InternalError("readlink /proc/self/exe");
  self[n] = '\0';
  const std::string mb = std::to_string(micro_batches),
                    w = std::to_string(warmup), s = std::to_string(steps);
  std::vector<Child> children;
  absl::Status status;
  for (int k = 0; k < kWorkers; ++k) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      status = absl::InternalError("pipe");
      break;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      execl(self, self, kChildFlag, model.c_str(), mb.c_str(), w.c_str(),
            s.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    Child c;
    c.pid = pid;
    c.in = fdopen(to_child[1], "w");
    c.out = fdopen(from_child[0], "r");
    children.push_back(c);
    if (pid < 0) status = absl::InternalError("fork");
  }
  char line[64];
  for (Child& c : children) {  // all warmed up
    if (status.ok() &&
        (c.pid < 0 || std::fgets(line, sizeof(line), c.out) == nullptr)) {
      status = absl::InternalError("a capacity child failed to start");
    }
  }
  for (Child& c : children) {  // then all start together
    std::fputs(status.ok() ? "go\n" : "no\n", c.in);
    std::fflush(c.in);
  }
  Capacity out;
  for (Child& c : children) {
    double rate = 0, cpu = 0;
    std::vector<std::string> fields;
    if (status.ok() && std::fgets(line, sizeof(line), c.out) != nullptr) {
      fields = absl::StrSplit(absl::StripAsciiWhitespace(line), ' ');
    }
    if (status.ok() &&
        (fields.size() != 2 || !absl::SimpleAtod(fields[0], &rate) ||
         !absl::SimpleAtod(fields[1], &cpu) || rate <= 0)) {
      status = absl::InternalError("a capacity child failed");
    }
    out.samples_per_s += rate;
    out.cpu_seconds_per_sample += cpu / kWorkers;
    std::fclose(c.in);
    std::fclose(c.out);
    int wstatus = 0;
    if (c.pid > 0) waitpid(c.pid, &wstatus, 0);
  }
  if (!status.ok()) return status;
  return out;
}

// ---- Per-stage counters ----

// The stage counters of one scrape (seconds), when it was taken and how
// many steps the stage had finished.
struct Scrape {
  bool ok = false;
  double at = 0;
  int64_t steps = 0;
  double cpu = -1;                       // the worker process's CPU seconds
  std::map<std::string, double> values;  // "forward", ..., "idle"
};

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A worker's /metrics text.
absl::StatusOr<std::string> MetricsText(const testing::Worker& worker) {
  auto r =
      testing_http::Send(worker.process->port("metrics"), "GET", "/metrics");
  if (!r.ok()) return r.status();
  if (r->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET /metrics of ", worker.address, ": ", r->status));
  }
  return std::move(r->body);
}

Scrape ScrapeStage(const testing::Worker& worker, int64_t steps) {
  Scrape out;
  out.at = Now();
  out.steps = steps;
  out.cpu = ProcessCpuSeconds(worker.process->pid());
  const absl::StatusOr<std::string> text = MetricsText(worker);
  if (!text.ok()) return out;
  const std::string compute = "pipetrain_stage_compute_seconds_total{phase=\"";
  const std::string idle = "pipetrain_stage_idle_seconds_total";
  const std::string send = "pipetrain_stage_send_seconds_total";
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::string key;
    if (absl::StartsWith(line, compute)) {
      line.remove_prefix(compute.size());
      key = std::string(line.substr(0, line.find('"')));
    } else if (absl::StartsWith(line, idle)) {
      key = "idle";
    } else if (absl::StartsWith(line, send)) {
      key = "send";
    } else {
      continue;
    }
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) {
      out.values[key] += v;
    }
  }
  out.ok = true;
  return out;
}

// Where one stage's time went, seconds per step, over a window of whole
// steps of that stage.
struct StageTime {
  bool ok = false;
  double wall = 0;  // the window's wall time per step
  double forward = 0, backward = 0, weight = 0, loss = 0, optimizer = 0,
         pack = 0, send = 0, blocked = 0;
  double cpu = -1;  // CPU seconds of the worker process, all threads
  double Other() const {
    return std::max(0.0, wall - forward - backward - weight - loss - optimizer -
                             pack - send - blocked);
  }
};

StageTime Breakdown(const Scrape& a, const Scrape& b) {
  StageTime t;
  const double n = static_cast<double>(b.steps - a.steps);
  if (!a.ok || !b.ok || n < 1) return t;
  auto d = [&](const char* k) {
    auto ia = a.values.find(k), ib = b.values.find(k);
    const double va = ia == a.values.end() ? 0 : ia->second;
    const double vb = ib == b.values.end() ? 0 : ib->second;
    return (vb - va) / n;
  };
  t.ok = true;
  t.wall = (b.at - a.at) / n;
  t.forward = d("forward") + d("recompute");
  t.backward = d("backward");
  t.weight = d("weight");
  t.send = d("send");
  t.loss = d("loss");
  t.optimizer = d("optimizer");
  t.pack = d("pack");
  t.blocked = d("idle");
  if (a.cpu >= 0 && b.cpu >= 0) t.cpu = (b.cpu - a.cpu) / n;
  return t;
}

// ---- One pipeline run ----

struct RunResult {
  absl::Status status;
  double step_seconds = 0;
  std::vector<StageTime> stages;
  // Per stage, predicted: the simulator's idle fraction for this schedule
  // with the per-micro-batch costs measured in the window (empty when the
  // window was not captured).
  std::vector<double> simulated_idle;
};

// PIPETRAIN_BENCH_TRACE: each stage's instructions over two whole steps
// from `step` (from the stages' GetTrace), as op+micro-batch@start-end in
// ms from the first instruction of `step` on any stage, on stderr.
void PrintTimeline(std::vector<testing::Worker>& workers,
                   const std::string& job, int64_t step) {
  std::vector<v1::GetTraceResponse> traces(workers.size());
  int64_t t0 = -1;
  for (size_t k = 0; k < workers.size(); ++k) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    v1::GetTraceRequest req;
    req.set_job_id(job);
    req.set_since_step(step);
    const grpc::Status status =
        workers[k].stub->GetTrace(&ctx, req, &traces[k]);
    if (!status.ok()) {
      std::fprintf(stderr, "stage %zu: no trace (%s)\n", k,
                   status.error_message().c_str());
    }
    for (const v1::TraceEvent& e : traces[k].events()) {
      if (e.step() == step && (t0 < 0 || e.start_unix_us() < t0)) {
        t0 = e.start_unix_us();
      }
    }
  }
  for (size_t k = 0; k < workers.size(); ++k) {
    std::string line = absl::StrCat("timeline stage ", k, ":");
    for (const v1::TraceEvent& e : traces[k].events()) {
      if (e.step() > step + 1) continue;
      absl::StrAppend(
          &line, absl::StrFormat(" %s%d@%.1f-%.1f", e.op(), e.micro_batch(),
                                 (e.start_unix_us() - t0) / 1e3,
                                 (e.end_unix_us() - t0) / 1e3));
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

RunResult RunCase(std::vector<testing::Worker>& workers, const std::string& job,
                  const v1::TrainingSpec& spec, v1::ScheduleKindProto kind,
                  const ScheduleParams& params, const std::vector<int>& cuts,
                  int warmup) {
  RunResult out;
  testing::PipelineOptions options;
  options.schedule = kind;
  options.fetch_weights = false;
  testing::PipelineRun run;
  std::atomic<bool> done{false};
  std::thread runner([&] {
    run = testing::RunPipeline(workers, job, spec, cuts, options);
    done = true;
  });
  // Each stage's window: from its finishing step `warmup` - 1 to finishing
  // step steps - 2 (whole steps; its counters are complete at each end).
  // Polled every 10 ms: a fraction of a percent of a step, and little load.
  std::vector<Scrape> first(kWorkers), last(kWorkers);
  std::vector<bool> started(kWorkers, false), ended(kWorkers, false);
  const int64_t end_step = spec.steps() - 1;
  while (!done) {
    for (int k = 0; k < kWorkers; ++k) {
      if (ended[k]) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
      v1::GetStatusRequest req;
      req.set_job_id(job);
      req.set_results_since(spec.steps());
      v1::GetStatusResponse status;
      if (!workers[k].stub->GetStatus(&ctx, req, &status).ok()) continue;
      const int64_t next = status.next_step();
      if (!started[k] && next >= warmup && next < end_step) {
        first[k] = ScrapeStage(workers[k], next);
        started[k] = true;
      } else if (started[k] && next >= end_step) {
        last[k] = ScrapeStage(workers[k], next);
        ended[k] = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  runner.join();
  if (std::getenv("PIPETRAIN_BENCH_TRACE") != nullptr) {
    PrintTimeline(workers, job, spec.steps() - 3);
  }
  out.status = run.status;
  if (!run.status.ok()) return out;
  out.step_seconds = MeanStepSeconds(run.stages.back(), warmup);
  std::vector<SimCosts> costs;
  const double m = static_cast<double>(params.micro_batches);
  for (int k = 0; k < kWorkers; ++k) {
    out.stages.push_back(ended[k] ? Breakdown(first[k], last[k]) : StageTime());
    SimCosts c;
    c.forward = out.stages.back().forward / m;
    c.backward = (out.stages.back().backward + out.stages.back().weight) / m;
    c.optimizer = out.stages.back().optimizer;
    costs.push_back(c);
  }
  bool all = true;
  for (const StageTime& t : out.stages) all = all && t.ok;
  if (all) {
    const SimResult sim = Simulate(params, costs[0], costs);
    if (sim.status.ok()) out.simulated_idle = sim.idle_fraction;
  }
  return out;
}

// ---- Statistics ----

double Min(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}
double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

struct Case {
  std::string model;
  const char* schedule;
  v1::ScheduleKindProto kind;
  int m;
  // Run on the workers whose CPU backend packs no weights
  // (PIPETRAIN_PACKED_GEMM=0): every product goes to OpenBLAS.
  bool unpacked = false;
  v1::TrainingSpec spec;
  std::vector<int> cuts;
  ScheduleParams params;
  double predicted_step = 0;
  std::string plan_line;
  // Per repetition.
  std::vector<double> rate, ratio, step;
  // CPU seconds per sample, both worker processes (all their threads);
  // and the cores they kept busy (CPU seconds per wall second).
  std::vector<double> cpu_per_sample, cores;
  std::vector<std::vector<StageTime>> stages;
  std::vector<std::vector<double>> simulated_idle;
};

// What the scheduler would know of `workers` once registered: the figures
// each measured of itself at start (message costs, CPUs; read from its
// /metrics, planner_figures.h), all on this machine.
absl::StatusOr<std::vector<v1::WorkerInfo>> DescribeWorkers(
    const std::vector<testing::Worker>& workers) {
  std::vector<v1::WorkerInfo> infos;
  for (const testing::Worker& worker : workers) {
    ASSIGN_OR_RETURN(const std::string text, MetricsText(worker));
    v1::WorkerInfo info;
    RETURN_IF_ERROR(ReadPlannerFigures(text, &info));
    info.set_host_id("this machine");
    infos.push_back(std::move(info));
  }
  return infos;
}

// The plan the scheduler would make for this case on K workers of equal
// speed and ample memory, with `measured`'s message costs and host (the
// links between them are not probed: the topology's default).
absl::Status PlanCase(const v1::ProfileResponse& profile,
                      const std::vector<v1::WorkerInfo>& measured, Case* c) {
  PlanInputs in;
  in.job_id = "plan";
  *in.spec.mutable_training() = c->spec;
  in.spec.set_schedule(c->kind);
  in.spec.set_num_stages(kWorkers);
  in.profile = profile;
  for (int k = 0; k < kWorkers; ++k) {
    v1::WorkerInfo w = measured[k];
    w.set_id(absl::StrFormat("w%d", k));
    w.set_address(absl::StrFormat("w%d", k));
    w.set_memory_bytes(int64_t{64} << 30);
    in.workers.push_back(w);
  }
  const v1::JobSpec job = in.spec;
  in.bubble = [job](int k) {
    auto b = JobTheoreticalBubble(job, k);
    return b.ok() ? *b : 0.0;
  };
  ASSIGN_OR_RETURN(v1::Plan plan, BuildPlan(in));
  c->cuts.clear();
  std::string line;
  for (const v1::PlannedStage& s : plan.stages()) {
    if (s.layer_begin() > 0) c->cuts.push_back(s.layer_begin());
    line += absl::StrFormat(" stage %d layers [%d,%d) %.2f ms/mb;", s.stage(),
                            s.layer_begin(), s.layer_end(),
                            s.compute_seconds() * 1e3);
  }
  if (plan.stages_size() != kWorkers) {
    return absl::FailedPreconditionError("the plan has the wrong stage count");
  }
  c->predicted_step = plan.predicted_step_seconds();
  c->plan_line = line;
  ASSIGN_OR_RETURN(c->params, JobScheduleParams(in.spec, kWorkers));
  return absl::OkStatus();
}

std::string Key(const Case& c) {
  std::string name = c.schedule;
  std::replace(name.begin(), name.end(), '-', '_');
  return absl::StrFormat("%s%s_m%d%s", c.model == "mlp" ? "" : "lm_", name, c.m,
                         c.unpacked ? "_unpacked" : "");
}

// The schedule as printed: "gpipe", or "gpipe/unpacked".
std::string Label(const Case& c) {
  return absl::StrCat(c.schedule, c.unpacked ? "/unpacked" : "");
}

int Main() {
  const int reps = static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_REPS", 3));
  const int steps =
      static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_STEPS", 6));
  const int warmup =
      static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_WARMUP", 2));
  // Two pairs of workers: the second's CPU backends pack no weights, for
  // the packed-vs-unpacked comparison (idle while the other pair runs).
  std::vector<testing::Worker> workers, unpacked_workers;
  for (int i = 0; i < 2 * kWorkers; ++i) {
    const bool unpacked = i >= kWorkers;
    if (unpacked) setenv("PIPETRAIN_PACKED_GEMM", "0", 1);
    auto w = testing::StartWorker({"--threads=1"});
    unsetenv("PIPETRAIN_PACKED_GEMM");
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
      return 1;
    }
    (unpacked ? unpacked_workers : workers).push_back(std::move(*w));
  }
  const absl::StatusOr<std::vector<v1::WorkerInfo>> worker_figures =
      DescribeWorkers(workers);
  if (!worker_figures.ok()) {
    std::fprintf(stderr, "%s\n", worker_figures.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> models = {"mlp", "lm"};
  if (const char* only = std::getenv("PIPETRAIN_BENCH_MODEL")) {
    models = {only};
  }
  const std::vector<std::pair<const char*, v1::ScheduleKindProto>> kinds = {
      {"gpipe", v1::SCHEDULE_GPIPE},
      {"1f1b-flush", v1::SCHEDULE_1F1B_FLUSH},
      {"zb-h1", v1::SCHEDULE_ZB_H1},
      // PipeDream's asynchronous 1F1B (one update per micro-batch), at
      // M = 8 only and never the headline: where its time goes beside the
      // synchronous schedules.
      {"1f1b-async", v1::SCHEDULE_ASYNC_1F1B}};
  std::vector<Case> cases;
  // Per model: capacity as the issue defines it (whole batch) and, for
  // reference, the same trainers splitting the batch into 8 micro-batches.
  std::map<std::string, std::vector<double>> capacity, capacity_m8,
      capacity_cpu, capacity_m8_cpu;
  for (const std::string& model : models) {
    auto base = ModelSpec(model);
    if (!base.ok()) {
      std::fprintf(stderr, "%s\n", base.status().ToString().c_str());
      return 1;
    }
    for (int m : {8, 16}) {
      v1::TrainingSpec spec = *base;
      spec.set_micro_batches(m);
      spec.set_steps(warmup + steps);
      // The scheduler's profile (ProfileRequestFor): worker 0,
      // micro-batches of batch / M, each layer run as the job's schedule
      // runs it (weights laid out once a step for the synchronous ones);
      // one profile per answer.
      // The unpacked cases are planned on a profile of their own workers,
      // as the scheduler profiles each kind of worker on its own device.
      std::map<std::pair<bool, bool>, v1::ProfileResponse> profiles;
      auto profile_for =
          [&](v1::ScheduleKindProto kind,
              bool unpacked) -> absl::StatusOr<const v1::ProfileResponse*> {
        v1::JobSpec job_spec;
        *job_spec.mutable_training() = spec;
        job_spec.set_schedule(kind);
        const v1::ProfileRequest req = ProfileRequestFor(job_spec, 3);
        const std::pair<bool, bool> key(unpacked, req.reuse_weights());
        auto it = profiles.find(key);
        if (it != profiles.end()) return &it->second;
        v1::ProfileResponse profile;
        grpc::ClientContext ctx;
        const grpc::Status profiled =
            (unpacked ? unpacked_workers : workers)[0].stub->Profile(&ctx, req,
                                                                     &profile);
        if (!profiled.ok()) return FromGrpcStatus(profiled);
        return &(profiles[key] = std::move(profile));
      };
      for (const auto& [name, kind] : kinds) {
        if (kind == v1::SCHEDULE_ASYNC_1F1B && m != 8) continue;
        Case c;
        c.model = model;
        c.schedule = name;
        c.kind = kind;
        c.m = m;
        c.spec = spec;
        auto plan = [&](Case* target) -> bool {
          absl::StatusOr<const v1::ProfileResponse*> profile =
              profile_for(target->kind, target->unpacked);
          if (!profile.ok()) {
            std::fprintf(stderr, "profile %s: %s\n", model.c_str(),
                         profile.status().ToString().c_str());
            return false;
          }
          const absl::Status planned =
              PlanCase(**profile, *worker_figures, target);
          if (!planned.ok()) {
            std::fprintf(stderr, "plan %s %s M=%d: %s\n", model.c_str(),
                         Label(*target).c_str(), m, planned.ToString().c_str());
            return false;
          }
          return true;
        };
        if (!plan(&c)) return 1;
        // GPipe and ZB-H1 at M = 8 again without packed weights, beside
        // the packed runs.
        const bool compare = m == 8 && (kind == v1::SCHEDULE_GPIPE ||
                                        kind == v1::SCHEDULE_ZB_H1);
        cases.push_back(c);
        if (compare) {
          c.unpacked = true;
          if (!plan(&c)) return 1;
          cases.push_back(std::move(c));
        }
      }
    }
  }
  int job = 0;
  for (int rep = 0; rep < reps; ++rep) {
    for (const std::string& model : models) {
      auto cap = MeasureCapacity(model, 1, warmup, steps);
      auto cap8 = MeasureCapacity(model, 8, warmup, steps);
      if (cap.ok() && !cap8.ok()) cap = cap8.status();
      if (!cap.ok()) {
        std::fprintf(stderr, "capacity %s: %s\n", model.c_str(),
                     cap.status().ToString().c_str());
        return 1;
      }
      capacity[model].push_back(cap->samples_per_s);
      capacity_cpu[model].push_back(cap->cpu_seconds_per_sample);
      capacity_m8[model].push_back(cap8->samples_per_s);
      capacity_m8_cpu[model].push_back(cap8->cpu_seconds_per_sample);
      std::fprintf(stderr, "rep %d %s capacity %.1f samples/s\n", rep,
                   model.c_str(), cap->samples_per_s);
      for (Case& c : cases) {
        if (c.model != model) continue;
        RunResult r = RunCase(c.unpacked ? unpacked_workers : workers,
                              absl::StrFormat("scaling-%d", ++job), c.spec,
                              c.kind, c.params, c.cuts, warmup);
        if (!r.status.ok() || r.step_seconds <= 0) {
          std::fprintf(stderr, "%s %s M=%d: %s\n", model.c_str(),
                       Label(c).c_str(), c.m, r.status.ToString().c_str());
          return 1;
        }
        const double rate = c.spec.batch_size() / r.step_seconds;
        c.rate.push_back(rate);
        c.ratio.push_back(rate / cap->samples_per_s);
        double cpu = 0, wall = 0;
        for (const StageTime& t : r.stages) {
          cpu = t.ok && t.cpu >= 0 && cpu >= 0 ? cpu + t.cpu : -1;
          wall = std::max(wall, t.wall);
        }
        if (cpu >= 0 && wall > 0) {
          c.cpu_per_sample.push_back(cpu / c.spec.batch_size());
          c.cores.push_back(cpu / wall);
        }
        c.step.push_back(r.step_seconds);
        c.stages.push_back(r.stages);
        c.simulated_idle.push_back(r.simulated_idle);
        std::fprintf(stderr, "rep %d %s %s M=%d %.1f samples/s\n", rep,
                     model.c_str(), Label(c).c_str(), c.m, rate);
      }
    }
  }

  std::printf(
      "K=%d worker processes, 1 BLAS thread each; %d repetitions of %d steps "
      "after %d warm-up; medians [min, max]\n",
      kWorkers, reps, steps, warmup);
  std::printf(
      "per stage: ms per step from its counters over whole steady-state "
      "steps (share of its wall time), medians over repetitions: forward, "
      "backward (B alone for ZB-H1), W (ZB-H1's weight pass, and for every "
      "synchronous schedule the weight-gradient products held over the "
      "step's micro-batches), loss, "
      "optimizer, pack (laying the updated weights out for the next step's "
      "products: the forward copies after each layer's update, the rest "
      "while waiting for a message), send (handing messages to "
      "the transport), blocked in a "
      "receive = idle by schedule (the simulator's idle with these costs) + "
      "waiting for input beyond it, and other (the executor's own work).\n");
  std::string json = "{\"bench\":\"scaling\"";
  for (const std::string& model : models) {
    const auto& cap = capacity[model];
    std::printf(
        "\n%s capacity (%d trainers x 1 thread, whole batch): %.1f "
        "samples/s [%.1f, %.1f]\n",
        model.c_str(), kWorkers, Median(cap), Min(cap), Max(cap));
    const auto& cap8 = capacity_m8[model];
    std::printf(
        "%s for reference, the same trainers in 8 micro-batches: %.1f "
        "samples/s [%.1f, %.1f] (not the ratios' denominator)\n"
        "%s CPU per sample (user + system, all threads): capacity %.2f ms, "
        "in 8 micro-batches %.2f ms\n",
        model.c_str(), Median(cap8), Min(cap8), Max(cap8), model.c_str(),
        Median(capacity_cpu[model]) * 1e3,
        Median(capacity_m8_cpu[model]) * 1e3);
    const char* prefix = model == "mlp" ? "" : "lm_";
    json += absl::StrFormat(
        ",\"%scapacity_samples_per_s\":%.1f,\"%scapacity_m8_samples_per_s\":"
        "%.1f",
        prefix, Median(cap), prefix, Median(cap8));
    for (const Case& c : cases) {
      if (c.model != model) continue;
      const double measured = Median(c.step);
      const double error = std::abs(c.predicted_step - measured) / measured;
      std::printf(
          "%s %-10s M=%-2d %8.1f samples/s [%.1f, %.1f]  vs capacity %.3f "
          "[%.3f, %.3f]  step %.1f ms, planner predicted %.1f ms (error "
          "%.2f)\n  plan:%s\n  CPU per sample %.2f ms (both workers, all "
          "threads); cores kept busy %.2f\n",
          model.c_str(), Label(c).c_str(), c.m, Median(c.rate), Min(c.rate),
          Max(c.rate), Median(c.ratio), Min(c.ratio), Max(c.ratio),
          measured * 1e3, c.predicted_step * 1e3, error, c.plan_line.c_str(),
          Median(c.cpu_per_sample) * 1e3, Median(c.cores));
      const double theory = TheoreticalBubble(c.params, SimCosts());
      std::vector<double> stage_sim_idle;  // per stage, median over reps
      for (int k = 0; k < kWorkers; ++k) {
        std::vector<double> wall, f, b, wp, l, o, pk, sd, bl, u, sim;
        for (const auto& rep : c.stages) {
          const StageTime& t = rep[k];
          if (!t.ok) continue;
          wall.push_back(t.wall);
          f.push_back(t.forward);
          b.push_back(t.backward);
          wp.push_back(t.weight);
          l.push_back(t.loss);
          o.push_back(t.optimizer);
          pk.push_back(t.pack);
          sd.push_back(t.send);
          bl.push_back(t.blocked);
          u.push_back(t.Other());
        }
        for (const auto& idle : c.simulated_idle) {
          if (static_cast<size_t>(k) < idle.size()) sim.push_back(idle[k]);
        }
        if (!sim.empty()) stage_sim_idle.push_back(Median(sim));
        if (wall.empty()) {
          std::printf("  stage %d: breakdown not captured (run too short)\n",
                      k);
          continue;
        }
        const double w = Median(wall);
        auto cell = [&](double seconds) {
          return absl::StrFormat("%6.1f (%2.0f%%)", seconds * 1e3,
                                 100 * seconds / w);
        };
        // Blocked time beyond the schedule's own idle: waiting for input.
        const double blocked = Median(bl);
        const double by_schedule =
            sim.empty() ? 0 : std::min(blocked, Median(sim) * w);
        const std::string split =
            sim.empty()
                ? std::string(" (not simulated)")
                : absl::StrCat(" = idle by schedule ", cell(by_schedule),
                               " + waiting for input ",
                               cell(blocked - by_schedule));
        std::printf(
            "  stage %d ms/step %6.1f: fwd %s bwd %s W %s loss %s opt %s "
            "pack %s send %s blocked %s%s; other %s (theoretical bubble "
            "%.1f%%)\n",
            k, w * 1e3, cell(Median(f)).c_str(), cell(Median(b)).c_str(),
            cell(Median(wp)).c_str(), cell(Median(l)).c_str(),
            cell(Median(o)).c_str(), cell(Median(pk)).c_str(),
            cell(Median(sd)).c_str(), cell(blocked).c_str(), split.c_str(),
            cell(Median(u)).c_str(), 100 * theory);
      }
      if (stage_sim_idle.size() == static_cast<size_t>(kWorkers)) {
        // The share of both workers' time this schedule leaves for their
        // measured work with this cut, were nothing else lost.
        double idle = 0;
        for (double f : stage_sim_idle) idle += f;
        const double ceiling = 1 - idle / kWorkers;
        std::string per_stage;
        for (size_t k = 0; k < stage_sim_idle.size(); ++k) {
          absl::StrAppend(&per_stage, k ? ", " : "", "stage ", k, " ",
                          absl::StrFormat("%.1f%%", 100 * stage_sim_idle[k]));
        }
        std::printf(
            "  schedule ceiling %.3f: simulated with these measured costs, "
            "the schedule and this cut keep the workers at most that busy "
            "(idle by schedule: %s)\n",
            ceiling, per_stage.c_str());
        json +=
            absl::StrFormat(",\"%s_schedule_ceiling\":%.3f", Key(c), ceiling);
      }
      json +=
          absl::StrFormat(",\"%s_vs_capacity\":%.3f", Key(c), Median(c.ratio));
    }
    // Packed against unpacked weights, the same schedule in the same
    // repetition: the median of the per-repetition ratios.
    for (const Case& packed : cases) {
      if (packed.model != model || packed.unpacked) continue;
      for (const Case& plain : cases) {
        if (!plain.unpacked || plain.model != model ||
            plain.kind != packed.kind || plain.m != packed.m) {
          continue;
        }
        std::vector<double> ratios;
        for (size_t r = 0; r < packed.rate.size() && r < plain.rate.size();
             ++r) {
          ratios.push_back(packed.rate[r] / plain.rate[r]);
        }
        std::printf(
            "%s %s M=%d packed weights vs unpacked: %.3f [%.3f, %.3f] "
            "samples/s\n",
            model.c_str(), packed.schedule, packed.m, Median(ratios),
            Min(ratios), Max(ratios));
        json += absl::StrFormat(",\"%s_packed_vs_unpacked\":%.3f", Key(packed),
                                Median(ratios));
      }
    }
  }
  // The headline: the best synchronous schedule at M = 8 on the MLP (on
  // the LM when PIPETRAIN_BENCH_MODEL runs only that).
  const std::string headline_model =
      std::find(models.begin(), models.end(), "mlp") != models.end()
          ? "mlp"
          : models.front();
  const Case* best = nullptr;
  for (const Case& c : cases) {
    if (c.model == headline_model && c.m == 8 &&
        c.kind != v1::SCHEDULE_ASYNC_1F1B && !c.unpacked && !c.step.empty() &&
        (best == nullptr || Median(c.ratio) > Median(best->ratio))) {
      best = &c;
    }
  }
  if (best == nullptr) {
    std::fprintf(stderr, "no synchronous M=8 run of %s completed\n",
                 headline_model.c_str());
    return 1;
  }
  const double measured = Median(best->step);
  const double error = std::abs(best->predicted_step - measured) / measured;
  std::printf(
      "\npipeline_vs_capacity %.3f (%s %s M=8); prediction_error %.3f "
      "(predicted %.1f ms, measured %.1f ms)\n",
      Median(best->ratio), headline_model.c_str(), best->schedule, error,
      best->predicted_step * 1e3, measured * 1e3);
  json += absl::StrFormat(
      ",\"pipeline_vs_capacity\":%.3f,\"pipeline_model\":\"%s\","
      "\"pipeline_best_schedule\":\"%s\",\"prediction_error\":%.3f,"
      "\"predicted_step_ms\":%.2f,\"measured_step_ms\":%.2f,\"reps\":%d}",
      Median(best->ratio), headline_model, best->schedule, error,
      best->predicted_step * 1e3, measured * 1e3, reps);
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  // The capacity trainers run with the heap the workers set (worker_main).
  pipetrain::KeepFreedHeapMemory();
  if (argc == 6 && std::strcmp(argv[1], pipetrain::kChildFlag) == 0) {
    int micro_batches = 0, warmup = 0, steps = 0;
    if (!absl::SimpleAtoi(argv[3], &micro_batches) ||
        !absl::SimpleAtoi(argv[4], &warmup) ||
        !absl::SimpleAtoi(argv[5], &steps)) {
      return 2;
    }
    return pipetrain::CapacityChild(argv[2], micro_batches, warmup, steps);
  }
  return pipetrain::Main();
}
