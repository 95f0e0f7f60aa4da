// pipetrain-worker: a stage worker. It serves the StageService (gRPC, with
// the standard health service) and Prometheus metrics, and runs whichever
// stage it is configured with.
//
//   pipetrain-worker --listen 0.0.0.0:7100 --metrics_port 9100 --device auto
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/http/http_server.h"
#include "services/rpc/grpc_server.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/process_util.h"
#include "services/worker/stage_service.h"
#include "services/worker/stage_streams.h"
#include "services/worker/worker_agent.h"
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
ABSL_FLAG(std::vector<std::string>, labels, {},
          "Labels as key=value, e.g. zone=edge");
ABSL_FLAG(int64_t, memory_bytes, 0,
          "Memory the planner may use on this worker (0: physical memory "
          "for the CPU, unknown for CUDA)");

namespace pipetrain {
namespace {

// What registration tells the scheduler about this worker.
// (The addresses are filled in once the ports are bound.)
absl::StatusOr<v1::WorkerInfo> DescribeWorker(Backend* backend) {
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
  ASSIGN_OR_RETURN(double gflops, MeasureGemmGflops(backend));
  info.set_gemm_gflops(gflops);
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
  MetricsRegistry registry;
  ASSIGN_OR_RETURN(std::unique_ptr<StageMetrics> metrics,
                   StageMetrics::Create(&registry));
  std::unique_ptr<HttpServer> http;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    ASSIGN_OR_RETURN(http,
                     HttpServer::Start(absl::GetFlag(FLAGS_metrics_host),
                                       absl::GetFlag(FLAGS_metrics_port), 2));
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

  ASSIGN_OR_RETURN(v1::WorkerInfo info, DescribeWorker(backend.get()));
  const size_t chunk_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes));
  StageHost stage_host(std::move(backend), metrics.get(),
                       DownstreamStreamOpener(metrics.get(), chunk_bytes));
  const Backend* memory_source = &stage_host.backend();
  StageServiceImpl service(&stage_host, [&stage_host, chunk_bytes] {
    return new UpstreamStream(&stage_host, chunk_bytes);
  });
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
  std::unique_ptr<WorkerAgent> agent;
  if (!absl::GetFlag(FLAGS_scheduler).empty()) {
    agent = std::make_unique<WorkerAgent>(absl::GetFlag(FLAGS_scheduler), info,
                                          &stage_host);
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
  pipetrain::BlockShutdownSignals();
  absl::SetProgramUsageMessage(
      "A pipetrain stage worker.\n"
      "  pipetrain-worker --listen 0.0.0.0:7100 --metrics_port 9100");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pipetrain::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "pipetrain-worker: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
