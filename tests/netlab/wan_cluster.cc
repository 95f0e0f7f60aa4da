#include "tests/netlab/wan_cluster.h"

#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/rpc/grpc_util.h"
#include "spec/model_spec.h"
#include "spec/wire_size.h"

namespace pipetrain::netlab {
namespace {

using Clock = std::chrono::steady_clock;

// One-way figures: a round trip crosses the link twice.
LinkParams Link(double mbit, double delay_ms, double loss = 0) {
  LinkParams p;
  p.rate_bits_per_s = mbit * 1e6;
  p.delay_s = delay_ms * 1e-3;
  p.loss = loss;
  return p;
}

const LinkParams kDatacenter = Link(10000, 0.1);

// Both directions between `a` and `b`.
void SetLink(LabOptions* lab, const std::string& a, const std::string& b,
             const LinkParams& p) {
  lab->links[{a, b}] = p;
  lab->links[{b, a}] = p;
}

std::string WorkerHost(int i) { return absl::StrCat("w", i); }

// A lab worker's flags besides its addresses: those testing::StartWorker
// gives a loopback worker (one BLAS thread each). Both clusters' schedulers
// keep their default leases and heartbeats, as deployed.
std::vector<std::string> WorkerFlags() {
  return {"--metrics_port=0", "--metrics_host=127.0.0.1", "--threads=1",
          "--device=cpu"};
}

}  // namespace

std::string ProbeBinary() {
  const char* path = std::getenv("PIPETRAIN_LINK_PROBE");
  return path != nullptr ? path : PIPETRAIN_DEFAULT_LINK_PROBE;
}

std::vector<std::string> ScenarioNames() {
  return {"datacenter", "two_regions", "edge", "mixed_speeds"};
}

absl::StatusOr<Scenario> MakeScenario(const std::string& name, int workers) {
  if (workers < 2 || workers > 8) {
    return absl::InvalidArgumentError("2 to 8 workers");
  }
  Scenario s;
  s.name = name;
  s.lab.hosts.push_back("sched");
  for (int i = 0; i < workers; ++i) s.lab.hosts.push_back(WorkerHost(i));
  s.lab.default_link = kDatacenter;
  LinkParams pipeline_link = kDatacenter;
  if (name == "datacenter") {
    s.description = "every link 10 Gb/s, 0.1 ms one-way";
  } else if (name == "two_regions") {
    // Region A: the scheduler and the even workers; region B: the odd ones.
    s.description =
        "region A (scheduler, w0, w2, ...) and region B (w1, w3, ...): "
        "1 Gb/s and 20 ms one-way between them, 10 Gb/s and 0.1 ms inside";
    pipeline_link = Link(1000, 20);
    std::vector<std::string> a = {"sched"}, b;
    for (int i = 0; i < workers; ++i) {
      (i % 2 == 0 ? a : b).push_back(WorkerHost(i));
    }
    for (const std::string& x : a) {
      for (const std::string& y : b) SetLink(&s.lab, x, y, pipeline_link);
    }
  } else if (name == "edge") {
    s.description =
        "w0 at the edge: its links 100 Mb/s, 50 ms one-way, 0.1% loss; the "
        "rest 10 Gb/s, 0.1 ms";
    pipeline_link = Link(100, 50, 0.001);
    for (const std::string& host : s.lab.hosts) {
      if (host != "w0") SetLink(&s.lab, "w0", host, pipeline_link);
    }
  } else if (name == "mixed_speeds") {
    s.description =
        "datacenter links; w1 capped at a third of a core (CPU quota)";
    s.cpu_share["w1"] = 0.33;
  } else {
    return absl::InvalidArgumentError("unknown scenario " + name);
  }
  s.configured_rtt_s = 2 * pipeline_link.delay_s;
  s.configured_rate_bits_per_s = pipeline_link.rate_bits_per_s;
  return s;
}

absl::StatusOr<std::unique_ptr<JobCluster>> JobCluster::OnLoopback(
    int workers) {
  std::unique_ptr<JobCluster> c(new JobCluster());
  auto scheduler = testing::StartScheduler(c->dir_.path());
  if (!scheduler.ok()) return scheduler.status();
  c->scheduler_process_ = std::move(scheduler->process);
  c->scheduler_ = std::move(scheduler->stub);
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> flags = {"--scheduler=" + scheduler->address,
                                      "--labels=zone=z0"};
    auto worker = testing::StartWorker(flags);
    if (!worker.ok()) return worker.status();
    c->workers_.push_back(std::move(worker->process));
  }
  if (absl::Status idle = c->WaitForIdleWorkers(workers, 60); !idle.ok()) {
    return idle;
  }
  return c;
}

absl::StatusOr<std::unique_ptr<JobCluster>> JobCluster::InScenario(
    const Scenario& scenario, int workers) {
  std::unique_ptr<JobCluster> c(new JobCluster());
  auto lab = NetLab::Create(scenario.lab);
  if (!lab.ok()) return lab.status();
  c->lab_ = std::move(*lab);
  NetLab& l = *c->lab_;
  // Plaintext off loopback needs --insecure: the lab's addresses are its
  // own namespaces' (the test PKI issues loopback-only certificates).
  const std::string scheduler_address = l.Address("sched") + ":7000";
  auto scheduler =
      l.Start("sched", testing::BinaryPath("pipetrain-scheduler"),
              {"--listen=" + scheduler_address, "--http_port=0",
               "--http_host=127.0.0.1",
               "--data_dir=" + c->dir_.path() + "/state", "--insecure"});
  if (!scheduler.ok()) return scheduler.status();
  c->scheduler_process_ = std::move(*scheduler);
  c->scheduler_ = v1::SchedulerService::NewStub(grpc::CreateCustomChannel(
      scheduler_address, grpc::InsecureChannelCredentials(),
      DefaultChannelArguments()));
  for (int i = 0; i < workers; ++i) {
    const std::string host = WorkerHost(i);
    // Namespaces are private: every worker serves on the same port.
    const std::string address = l.Address(host) + ":7100";
    std::vector<std::string> flags = WorkerFlags();
    flags.insert(flags.end(), {"--listen=" + address, "--advertise=" + address,
                               "--scheduler=" + scheduler_address, "--insecure",
                               "--labels=zone=" + host});
    std::string cgroup;
    if (auto share = scenario.cpu_share.find(host);
        share != scenario.cpu_share.end()) {
      auto made = l.CpuCgroup(share->second);
      if (!made.ok()) return made.status();
      cgroup = *made;
    }
    auto worker =
        l.Start(host, testing::BinaryPath("pipetrain-worker"), flags, cgroup);
    if (!worker.ok()) return worker.status();
    c->workers_.push_back(std::move(*worker));
  }
  if (absl::Status idle = c->WaitForIdleWorkers(workers, 60); !idle.ok()) {
    return idle;
  }
  return c;
}

JobCluster::~JobCluster() {
  // Processes before the lab that holds their namespaces and cgroups.
  probes_.clear();
  workers_.clear();
  scheduler_process_.reset();
}

absl::Status JobCluster::WaitForIdleWorkers(int n, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int idle = 0;
  while (Clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    v1::ListWorkersResponse listed;
    if (scheduler_->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok()) {
      idle = 0;
      for (const auto& w : listed.workers()) {
        idle += w.state() == v1::WORKER_STATE_IDLE;
      }
      if (idle >= n) return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      idle, " of ", n, " workers registered within ", timeout_s, " s"));
}

v1::ListWorkersResponse JobCluster::Workers() {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  v1::ListWorkersResponse listed;
  (void)scheduler_->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed);
  return listed;
}

int64_t JobCluster::WorkerLinkBytes() {
  if (lab_ == nullptr) return -1;
  auto counters = lab_->Counters();
  if (!counters.ok()) return -1;
  int64_t bytes = 0;
  for (const auto& [link, c] : *counters) {
    if (link.first[0] == 'w' && link.second[0] == 'w') bytes += c.bytes;
  }
  return bytes;
}

JobRun JobCluster::Run(const v1::JobSpec& spec, double timeout_s) {
  JobRun run;
  // Counted from the moment the job runs: the link probes the scheduler
  // asks for while planning cross the same links, and are not the job's.
  int64_t bytes_before = WorkerLinkBytes();
  bool running_seen = false;
  const auto start = Clock::now();
  {
    v1::SubmitJobRequest q;
    *q.mutable_spec() = spec;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    run.submitted = FromGrpcStatus(scheduler_->SubmitJob(&ctx, q, &run.job));
    if (!run.submitted.ok()) return run;
  }
  const std::string id = run.job.id();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(10));
    v1::GetJobRequest q;
    q.set_job_id(id);
    v1::Job job;
    if (scheduler_->GetJob(&ctx, q, &job).ok()) {
      run.job = job;
      if (!running_seen && job.state() == v1::JOB_STATE_RUNNING) {
        running_seen = true;
        bytes_before = WorkerLinkBytes();
      }
      if (job.state() == v1::JOB_STATE_COMPLETED ||
          job.state() == v1::JOB_STATE_FAILED ||
          job.state() == v1::JOB_STATE_CANCELLED) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  run.wall_seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  run.completed = run.job.state() == v1::JOB_STATE_COMPLETED;
  if (bytes_before >= 0) {
    const int64_t bytes_after = WorkerLinkBytes();
    if (bytes_after >= 0) run.worker_link_bytes = bytes_after - bytes_before;
  }
  if (run.job.samples_per_second() > 0) {
    run.step_seconds =
        spec.training().batch_size() / run.job.samples_per_second();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  v1::GetPlanRequest q;
  q.set_job_id(id);
  (void)scheduler_->GetPlan(&ctx, q, &run.plan);
  return run;
}

absl::StatusOr<double> JobCluster::MeasureRtt(const std::string& from,
                                              const std::string& to) {
  if (lab_ == nullptr) return absl::FailedPreconditionError("no lab");
  auto server = lab_->Start(to, ProbeBinary(),
                            {"serve", "--listen=" + lab_->Address(to)});
  if (!server.ok()) return server.status();
  const std::string target =
      absl::StrCat(lab_->Address(to), ":", (*server)->port("probe"));
  probes_.push_back(std::move(*server));
  auto out =
      lab_->Run(from, {ProbeBinary(), "rtt", "--to=" + target, "--count=20"});
  if (!out.ok()) return out.status();
  const size_t at = out->find("rtt_median_ms=");
  double ms = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtod(
          out->substr(at + 14, out->find_first_of(" \n", at) - at - 14), &ms)) {
    return absl::InternalError("unexpected probe output: " + *out);
  }
  return ms * 1e-3;
}

int64_t WireBytesPerSample(const v1::JobSpec& spec, const v1::Plan& plan) {
  auto shapes = ValidateModelSpec(spec.training().model());
  if (!shapes.ok()) return -1;
  int64_t total = 0;
  for (int s = 0; s + 1 < plan.stages_size(); ++s) {
    const int cut = plan.stages(s).layer_end();
    if (cut < 0 || cut >= static_cast<int>(shapes->size())) return -1;
    const Shape& shape = (*shapes)[cut];
    for (bool gradient : {false, true}) {
      const int64_t bytes = StreamedTensorWireBytes(
          shape, spec.wire_dtype(),
          DirectionQuantization(spec.wire_compression(), gradient),
          spec.wire_compression().group_size());
      if (bytes < 0) return -1;
      total += bytes;
    }
  }
  return total;
}

}  // namespace pipetrain::netlab
