// pipetrain-worker: a stage worker. It serves the StageService (gRPC, with
// the standard health service) and Prometheus metrics, and runs whichever
// stage it is configured with.
//
//   pipetrain-worker --listen 0.0.0.0:7100 --metrics_port 9100 --device auto
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cpu_quota.h"
#include "common/heap_tuning.h"
#include "common/logging.h"
#include "common/metrics_registry.h"
#include "common/secret.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/auth/security_flags.h"
#include "services/http/http_server.h"
#include "services/rpc/grpc_server.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/process_util.h"
#include "services/worker/link_prober.h"
#include "services/worker/planner_figures.h"
#include "services/worker/stage_access.h"
#include "services/worker/stage_service.h"
#include "services/worker/stage_streams.h"
#include "services/worker/stream_probe.h"
#include "services/worker/worker_agent.h"
#include "worker/data/data_access.h"
#include "worker/pipeline/profiler.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7100",
          "gRPC address to serve on (port 0 picks a free port)");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda");
ABSL_FLAG(int, threads, 0, "CPU threads for BLAS and loops (0: all cores)");
ABSL_FLAG(int, metrics_port, 9100,
          "Port of the HTTP /metrics endpoint (0 picks one, -1 disables)");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "Address of /metrics");
ABSL_FLAG(std::string, port_file, "",
          "Write the bound ports here (grpc=N, metrics=N) once serving");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20,
          "Payload bytes per frame on the stage-to-stage stream");
ABSL_FLAG(std::string, scheduler, "",
          "Scheduler address (host:port) to register with; empty: none");
ABSL_FLAG(std::string, advertise, "",
          "Address other workers and the scheduler dial (default: the "
          "listen host, or 127.0.0.1 when listening on every interface)");
ABSL_FLAG(std::string, worker_id, "", "Worker id (default: assigned)");
ABSL_FLAG(std::string, join_token_file, "",
          "File holding the cluster's join token, sent when registering");
ABSL_FLAG(std::string, scheduler_identity, pipetrain::kDefaultSchedulerIdentity,
          "Certificate name (CN or SAN) of the scheduler: under mutual TLS "
          "only it may configure, train or stop this worker");
ABSL_FLAG(std::vector<std::string>, labels, {},
          "Labels as key=value, e.g. zone=edge");
ABSL_FLAG(int64_t, memory_bytes, 0,
          "Memory the planner may use on this worker (0: physical memory "
          "for the CPU, unknown for CUDA)");
ABSL_FLAG(double, gemm_gflops, 0,
          "GEMM speed the planner assumes for this worker, GFLOP/s (0: "
          "measure it at start, scaled down to the process's cgroup CPU "
          "limit; a measurement on a busy machine can be far off)");
ABSL_FLAG(std::string, host_id, "",
          "The machine this worker runs on, for the planner's floor under "
          "stages that share a machine's CPUs; empty: the kernel's boot id "
          "(the same in every container of a machine). '-' reports none: "
          "the planner then counts no shared CPUs for this worker (e.g. "
          "tests that stand a cluster of machines up on one).");
ABSL_FLAG(std::vector<std::string>, data_root,
          std::vector<std::string>(absl::StrSplit(pipetrain::kDefaultDataRoots,
                                                  ',')),
          "Directories job data may be read from (comma-separated); paths "
          "are resolved (realpath) and must be regular files under one");
ABSL_FLAG(int64_t, max_data_file_bytes, pipetrain::kDefaultMaxDataFileBytes,
          "Bytes one data file (or a character corpus in all) may yield");

namespace pipetrain {
namespace {

// The machine this process runs on, as the workers that share its CPUs
// see it: the kernel's boot id (one per boot of a machine, the same in all
// of its containers), else the host name; empty when neither is readable.
std::string HostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in && std::getline(in, id) && !id.empty()) return id;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) return name;
  return "";
}

// The CPUs this process may run on.
int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The CPU this worker may keep busy under its cgroup's limit.
struct CpuAllowance {
  // The cgroup's limit in cores, whatever the device; nullopt without one.
  std::optional<double> limit;
  // The share of the CPU backend's full speed a sustained computation gets
  // under `limit` (1 on CUDA, or with no limit).
  double share = 1.0;
};

CpuAllowance ComputeAllowance(const Backend& backend) {
  CpuAllowance allowance;
  allowance.limit = CgroupCpuLimit();
  if (backend.device() != Device::kCpu) return allowance;
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) {
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  allowance.share = CpuShareOf(allowance.limit, threads);
  if (allowance.share < 1) {
    PT_LOG(INFO) << "cgroup CPU limit " << *allowance.limit << " cores for "
                 << threads
                 << " compute thread(s): measured speeds are reported at "
                 << allowance.share << " of what short runs show";
  }
  return allowance;
}

// What registration tells the scheduler about this worker.
// (The addresses are filled in once the ports are bound.)
// A measured GEMM speed is scaled by `allowance.share`.
absl::StatusOr<v1::WorkerInfo> DescribeWorker(Backend* backend,
                                              const CpuAllowance& allowance) {
  v1::WorkerInfo info;
  info.set_id(absl::GetFlag(FLAGS_worker_id));
  info.set_device_kind(DeviceName(backend->device()));
  info.set_device(backend->Describe());
  int64_t memory = absl::GetFlag(FLAGS_memory_bytes);
  if (memory == 0 && backend->device() == Device::kCpu) {
    memory =
        static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  }
  info.set_memory_bytes(memory);
  double gflops = absl::GetFlag(FLAGS_gemm_gflops);
  if (!(gflops >= 0)) {
    return absl::InvalidArgumentError("--gemm_gflops must be 0 or positive");
  }
  if (gflops == 0) {
    ASSIGN_OR_RETURN(gflops, MeasureGemmGflops(backend));
    gflops *= allowance.share;
  }
  info.set_gemm_gflops(gflops);
  if (allowance.limit.has_value()) info.set_cpu_limit_cores(*allowance.limit);
  for (const std::string& label : absl::GetFlag(FLAGS_labels)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(label, '=');
    if (kv.first.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--labels: '", label, "' is not key=value"));
    }
    (*info.mutable_labels())[kv.first] = kv.second;
  }
  return info;
}

absl::Status Run() {
  DataAccessPolicy data_policy;
  data_policy.roots = absl::GetFlag(FLAGS_data_root);
  data_policy.max_file_bytes = absl::GetFlag(FLAGS_max_data_file_bytes);
  RETURN_IF_ERROR(SetDataAccessPolicy(data_policy));
  // /metrics is HTTPS with the gRPC certificate, or plaintext where
  // plaintext gRPC would be allowed.
  const bool serve_metrics = absl::GetFlag(FLAGS_metrics_port) >= 0;
  ASSIGN_OR_RETURN(
      const TransportSecurity security,
      SetUpTransportSecurityFromFlags(
          {{"--listen", absl::GetFlag(FLAGS_listen)},
           {"--scheduler", absl::GetFlag(FLAGS_scheduler)},
           {"--advertise", absl::GetFlag(FLAGS_advertise)},
           {"--metrics_host",
            serve_metrics ? absl::GetFlag(FLAGS_metrics_host) : ""}}));
  std::string join_token;
  if (!absl::GetFlag(FLAGS_join_token_file).empty()) {
    ASSIGN_OR_RETURN(join_token,
                     ReadSecretFile("join_token_file",
                                    absl::GetFlag(FLAGS_join_token_file)));
  }
  MetricsRegistry registry;
  ASSIGN_OR_RETURN(std::unique_ptr<StageMetrics> metrics,
                   StageMetrics::Create(&registry));
  std::unique_ptr<HttpServer> http;
  if (serve_metrics) {
    HttpServerOptions http_options;
    http_options.host = absl::GetFlag(FLAGS_metrics_host);
    http_options.port = absl::GetFlag(FLAGS_metrics_port);
    http_options.threads = 2;
    if (security.tls()) {
      http_options.tls_cert_file = TlsCertFlag();
      http_options.tls_key_file = TlsKeyFlag();
    }
    ASSIGN_OR_RETURN(http, HttpServer::Start(http_options));
    ServeMetrics(http.get(), &registry);
    http->Handle("GET", "/healthz", [](const HttpRequest&) {
      HttpResponse r;
      r.body = "{\"status\":\"ok\"}";
      return r;
    });
  }

  BackendOptions backend_options;
  ASSIGN_OR_RETURN(backend_options.kind,
                   ParseBackendKind(absl::GetFlag(FLAGS_device)));
  backend_options.threads = absl::GetFlag(FLAGS_threads);
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   CreateBackend(backend_options));
  const std::string device = backend->Describe();

  const CpuAllowance allowance = ComputeAllowance(*backend);
  ASSIGN_OR_RETURN(v1::WorkerInfo info,
                   DescribeWorker(backend.get(), allowance));
  const size_t chunk_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes));
  StageHost stage_host(std::move(backend), metrics.get(),
                       DownstreamStreamOpener(metrics.get(), chunk_bytes),
                       allowance.share);
  const Backend* memory_source = &stage_host.backend();
  // Identities are certificate names: the checks need TLS.
  StageServiceImpl service(
      &stage_host,
      [&stage_host, chunk_bytes](grpc::CallbackServerContext* context,
                                 bool probe) {
        return new UpstreamStream(&stage_host, chunk_bytes, context->peer(),
                                  probe, context);
      },
      StageAccess(security.tls(), absl::GetFlag(FLAGS_scheduler_identity)));
  // /metrics reads the backend: stop serving it before `stage_host` goes,
  // on every return path.
  absl::Cleanup stop_http = [&http] {
    if (http != nullptr) http->Stop();
  };
  RETURN_IF_ERROR(registry.AddCallbackGauge(
      "pipetrain_stage_device_memory_bytes",
      "Memory the stage's backend holds on its device: for cuda, GPU memory "
      "reserved by its caching allocator; for cpu, the resident set size of "
      "the worker process (/proc/self/statm).",
      {"device"}, [memory_source] {
        return std::vector<GaugeSample>{
            {{DeviceName(memory_source->device())},
             static_cast<double>(memory_source->MemoryBytes())}};
      }));
  int grpc_port = 0;
  ASSIGN_OR_RETURN(
      std::unique_ptr<grpc::Server> server,
      StartGrpcServer(absl::GetFlag(FLAGS_listen), &service, &grpc_port));
  const int metrics_port = http != nullptr ? http->port() : -1;
  std::string host;
  int unused_port = 0;
  RETURN_IF_ERROR(
      SplitHostPort(absl::GetFlag(FLAGS_listen), &host, &unused_port));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  const std::string advertise = absl::GetFlag(FLAGS_advertise);
  info.set_address(advertise.empty() ? absl::StrCat(host, ":", grpc_port)
                                     : advertise);
  if (metrics_port > 0) {
    info.set_metrics_address(absl::StrCat(host, ":", metrics_port));
  }
  // The per-message cost of this worker's gRPC stack, for the planner:
  // its own server, dialled at the address it listens on.
  LinkProbeOptions self_probe;
  self_probe.rtt_calls = 100;
  const absl::StatusOr<MessageCost> cost =
      MeasureMessageCost(absl::StrCat(host, ":", grpc_port), self_probe);
  if (cost.ok()) {
    info.set_message_overhead_seconds(cost->seconds);
    info.set_message_cpu_seconds(cost->cpu_seconds);
    PT_LOG(INFO) << "message overhead " << cost->seconds * 1e6 << " us, CPU "
                 << cost->cpu_seconds * 1e6 << " us per message end";
  } else {
    PT_LOG(WARNING) << "cannot measure the message overhead on its own server "
                    << "(the planner falls back on link round trips): "
                    << cost.status();
  }
  // The same on a stage stream to its own server, the way a stage's
  // messages go: the planner's message CPU and stream latency.
  const absl::StatusOr<StreamMessageCost> stream_cost =
      MeasureStreamMessageCost(absl::StrCat(host, ":", grpc_port));
  if (stream_cost.ok()) {
    info.set_stream_hop_seconds(stream_cost->hop_seconds);
    info.set_message_cpu_seconds(stream_cost->cpu_seconds);
    info.set_message_cpu_seconds_per_byte(stream_cost->cpu_seconds_per_byte);
    PT_LOG(INFO) << "stage stream: " << stream_cost->hop_seconds * 1e6
                 << " us a message, CPU " << stream_cost->cpu_seconds * 1e6
                 << " us per message end and "
                 << stream_cost->cpu_seconds_per_byte * 1e9
                 << " ms per MB of payload";
  } else {
    PT_LOG(WARNING) << "cannot measure a stage stream on its own server (the "
                    << "planner uses the Probe calls' figures): "
                    << stream_cost.status();
  }
  const std::string host_id = absl::GetFlag(FLAGS_host_id);
  if (host_id != "-") info.set_host_id(host_id.empty() ? HostId() : host_id);
  info.set_host_cpus(AffinityCpus());
  RETURN_IF_ERROR(ExportPlannerFigures(info, &registry));
  std::unique_ptr<WorkerAgent> agent;
  if (!absl::GetFlag(FLAGS_scheduler).empty()) {
    agent = std::make_unique<WorkerAgent>(absl::GetFlag(FLAGS_scheduler), info,
                                          &stage_host, join_token);
  }
  RETURN_IF_ERROR(
      WritePortFile(absl::GetFlag(FLAGS_port_file),
                    {{"grpc", grpc_port}, {"metrics", metrics_port}}));
  PT_LOG(INFO) << "pipetrain-worker serving gRPC on port " << grpc_port
               << ", metrics on port " << metrics_port << ", device " << device;

  const int signal = WaitForShutdownSignal();
  PT_LOG(INFO) << "signal " << signal << ": shutting down";
  agent.reset();
  stage_host.Shutdown();
  server->Shutdown(DeadlineIn(5));
  if (http != nullptr) http->Stop();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  // Before any thread starts: gRPC's receive slices then reuse freed heap
  // memory instead of fresh pages (common/heap_tuning.h).
  const pipetrain::HeapTuning heap = pipetrain::KeepFreedHeapMemory();
  pipetrain::BlockShutdownSignals();
  absl::SetProgramUsageMessage(
      "A pipetrain stage worker.\n"
      "  pipetrain-worker --listen 0.0.0.0:7100 --metrics_port 9100");
  absl::ParseCommandLine(argc, argv);
  PT_LOG(INFO) << pipetrain::HeapTuningDescription(heap);
  const absl::Status status = pipetrain::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "pipetrain-worker: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
