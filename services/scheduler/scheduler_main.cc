// pipetrain-scheduler: registers workers, plans and runs jobs, keeps the
// version ledger, and serves the control API over gRPC (port --listen) and
// REST JSON, /metrics, /healthz and /readyz over HTTP (--http_port).
//
//   pipetrain-scheduler --listen 0.0.0.0:7000 --http_port 8080
//       --data_dir /var/lib/pipetrain
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/metrics_registry.h"
#include "common/secret.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "scheduler/checkpoint_store.h"
#include "services/auth/access_policy.h"
#include "services/auth/security_flags.h"
#include "services/http/http_server.h"
#include "services/rpc/grpc_server.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/process_util.h"
#include "services/scheduler/grpc_stage_control.h"
#include "services/scheduler/rest_gateway.h"
#include "services/scheduler/scheduler_service.h"
#include "services/scheduler/scheduler_support.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7000", "gRPC address to serve on");
ABSL_FLAG(std::string, http_host, "0.0.0.0", "Address of the HTTP endpoint");
ABSL_FLAG(int, http_port, 8080,
          "Port of REST, /metrics, /healthz and /readyz (0 picks one)");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{1} << 20,
          "Largest REST request body accepted; larger ones get 413");
ABSL_FLAG(std::string, data_dir, "pipetrain-data",
          "Directory of the scheduler's SQLite state");
ABSL_FLAG(double, lease_seconds, 3.0,
          "A worker missing heartbeats this long is LOST");
ABSL_FLAG(double, heartbeat_seconds, 0.5, "Heartbeat interval for workers");
ABSL_FLAG(double, lost_worker_expiry_seconds, 3600,
          "Forget a LOST worker this long after its last heartbeat (0: keep "
          "it until `pipetrainctl workers remove`)");
ABSL_FLAG(double, checkpoint_interval_seconds, 60,
          "Jobs without checkpointEvery checkpoint this often");
ABSL_FLAG(double, stage_recv_timeout_seconds, 60.0,
          "Seconds a stage waits for a neighbour before failing a step");
ABSL_FLAG(std::string, zone_bandwidth, "",
          "Link bandwidth between worker zones in bytes/s, e.g. "
          "cloud-edge=1e8,cloud-mesh=1e9; overrides the workers' measured "
          "links between those zones");
ABSL_FLAG(std::string, zone_latency, "",
          "Round-trip time between worker zones in seconds, e.g. "
          "cloud-edge=0.05; overrides the measured RTT between those zones");
ABSL_FLAG(double, intra_zone_bandwidth, 10e9,
          "Bandwidth within a zone for worker pairs not measured yet");
ABSL_FLAG(double, default_bandwidth, 1e9,
          "Bandwidth between zones not in --zone_bandwidth for worker pairs "
          "not measured yet");
ABSL_FLAG(double, link_refresh_seconds, 600,
          "Idle workers measure their links again when the last measurement "
          "is older than this");
ABSL_FLAG(double, probe_wait_seconds, 5,
          "Before planning a job, wait at most this long for the links among "
          "its workers to be measured (then plan with what is known)");
ABSL_FLAG(double, message_overhead_seconds, -1,
          "Stage time the planner charges per stream message sent or "
          "received, on top of the link's latency; -1: measured, the "
          "median of what the workers measured on their own gRPC stacks "
          "(else a quarter of the median round trip of their link probes)");
ABSL_FLAG(std::string, port_file, "",
          "Write the bound ports here (grpc=N, http=N) once serving");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer tokens of the control API, one 'TOKEN ROLE' per line "
          "(roles: viewer, operator); without it the API is open, which is "
          "allowed on loopback addresses or with --insecure only");
ABSL_FLAG(std::string, join_token_file, "",
          "File holding the join token workers must present to register");

namespace pipetrain {
namespace {

absl::Status ParseZoneLatency(Topology* t) {
  const std::string spec = absl::GetFlag(FLAGS_zone_latency);
  if (spec.empty()) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, '=');
    std::pair<std::string, std::string> zones = absl::StrSplit(kv.first, '-');
    double rtt = -1;
    if (zones.first.empty() || zones.second.empty() ||
        !absl::SimpleAtod(kv.second, &rtt) || !(rtt >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--zone_latency: '", item, "' is not zoneA-zoneB=seconds (>= 0)"));
    }
    t->rtt[{zones.first, zones.second}] = rtt;
  }
  return absl::OkStatus();
}

absl::StatusOr<Topology> ParseTopology() {
  Topology t;
  t.intra_zone_bandwidth = absl::GetFlag(FLAGS_intra_zone_bandwidth);
  t.default_bandwidth = absl::GetFlag(FLAGS_default_bandwidth);
  RETURN_IF_ERROR(ParseZoneLatency(&t));
  const std::string spec = absl::GetFlag(FLAGS_zone_bandwidth);
  if (spec.empty()) return t;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, '=');
    std::pair<std::string, std::string> zones = absl::StrSplit(kv.first, '-');
    double bw = 0;
    if (zones.first.empty() || zones.second.empty() ||
        !absl::SimpleAtod(kv.second, &bw) || bw <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--zone_bandwidth: '", item, "' is not zoneA-zoneB=bytes_per_s"));
    }
    t.bandwidth[{zones.first, zones.second}] = bw;
  }
  return t;
}

// Who may call: tokens for users, the join token for workers. Without
// them the scheduler is open, which only loopback addresses (or
// --insecure) allow.
absl::StatusOr<SchedulerAccess> LoadAccess() {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const std::string http_host = absl::GetFlag(FLAGS_http_host);
  const bool local = IsLoopbackAddress(listen) && IsLoopbackAddress(http_host);
  SchedulerAccess access;
  const std::string tokens = absl::GetFlag(FLAGS_auth_tokens_file);
  if (!tokens.empty()) {
    ASSIGN_OR_RETURN(TokenTable table, TokenTable::Load(tokens));
    PT_LOG(INFO) << "control API: " << table.size() << " bearer tokens from "
                 << tokens;
    access.api = ApiAuthorizer(std::move(table));
  } else if (local || InsecureFlag()) {
    PT_LOG(WARNING) << "no --auth_tokens_file: anyone who can reach the "
                       "control API may submit and cancel jobs";
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("no --auth_tokens_file: the control API on ", listen,
                     " and ", http_host,
                     " would be open to the network; give --auth_tokens_file, "
                     "or --insecure to run it open anyway"));
  }
  const std::string join = absl::GetFlag(FLAGS_join_token_file);
  if (!join.empty()) {
    ASSIGN_OR_RETURN(access.join_token,
                     ReadSecretFile("join_token_file", join));
  } else if (!local && !InsecureFlag()) {
    return absl::FailedPreconditionError(
        "no --join_token_file: any host could register as a worker; give "
        "--join_token_file, or --insecure to admit workers without one");
  }
  return access;
}

absl::Status Run() {
  // The REST and /metrics port is HTTPS with the gRPC certificate, or
  // plaintext where plaintext gRPC would be allowed.
  ASSIGN_OR_RETURN(const TransportSecurity security,
                   SetUpTransportSecurityFromFlags(
                       {{"--listen", absl::GetFlag(FLAGS_listen)},
                        {"--http_host", absl::GetFlag(FLAGS_http_host)}}));
  ASSIGN_OR_RETURN(SchedulerAccess access, LoadAccess());
  SchedulerOptions options;
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.registry.lease_seconds = absl::GetFlag(FLAGS_lease_seconds);
  options.registry.lost_expiry_seconds =
      absl::GetFlag(FLAGS_lost_worker_expiry_seconds);
  options.checkpoint_interval_seconds =
      absl::GetFlag(FLAGS_checkpoint_interval_seconds);
  options.registry.heartbeat_interval_seconds =
      absl::GetFlag(FLAGS_heartbeat_seconds);
  options.stage_recv_timeout_seconds =
      absl::GetFlag(FLAGS_stage_recv_timeout_seconds);
  ASSIGN_OR_RETURN(options.topology, ParseTopology());
  options.registry.link_refresh_seconds =
      absl::GetFlag(FLAGS_link_refresh_seconds);
  options.probe_wait_seconds = absl::GetFlag(FLAGS_probe_wait_seconds);
  options.message_overhead_seconds =
      absl::GetFlag(FLAGS_message_overhead_seconds);
  if (!(options.probe_wait_seconds >= 0) ||
      !(options.message_overhead_seconds >= 0 ||
        options.message_overhead_seconds == -1) ||
      !(options.registry.link_refresh_seconds > 0)) {
    return absl::InvalidArgumentError(
        "--probe_wait_seconds must be >= 0, --message_overhead_seconds >= 0 "
        "or -1 (measured), --link_refresh_seconds > 0");
  }

  // Checkpoints live beside the scheduler's state (a PVC on Kubernetes).
  std::unique_ptr<CheckpointStore> checkpoints;
  if (!options.data_dir.empty()) {
    ASSIGN_OR_RETURN(checkpoints, CheckpointStore::Open(options.data_dir));
    options.checkpoints = checkpoints.get();
    // Model exports a job may start from (initFrom) are read only here.
    options.models_dir = options.data_dir + "/models";
    std::error_code made;
    std::filesystem::create_directories(options.models_dir, made);
    if (made) {
      return absl::UnavailableError(absl::StrCat(
          "cannot create ", options.models_dir, ": ", made.message()));
    }
  }
  MetricsRegistry registry;
  GrpcStageControl control;
  SpecModelSupport model;
  ASSIGN_OR_RETURN(std::unique_ptr<SchedulerCore> core,
                   SchedulerCore::Create(options, &control, &model, &registry));
  ControlCallMetrics call_metrics(&registry);

  HttpServerOptions http_options;
  http_options.host = absl::GetFlag(FLAGS_http_host);
  http_options.port = absl::GetFlag(FLAGS_http_port);
  http_options.threads = 8;
  http_options.max_body_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_http_max_body_bytes));
  if (security.tls()) {
    http_options.tls_cert_file = TlsCertFlag();
    http_options.tls_key_file = TlsKeyFlag();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> http,
                   HttpServer::Start(http_options));
  ServeMetricsWithAuth(http.get(), &registry, &call_metrics, &access.api);
  http->Handle("GET", "/healthz", [](const HttpRequest&) {
    HttpResponse r;
    r.body = "{\"status\":\"ok\"}";
    return r;
  });
  SchedulerCore* core_ptr = core.get();
  http->Handle("GET", "/readyz", [core_ptr](const HttpRequest&) {
    HttpResponse r;
    r.status = core_ptr->ready() ? 200 : 503;
    r.body = core_ptr->ready() ? "{\"status\":\"ready\"}"
                               : "{\"status\":\"starting\"}";
    return r;
  });
  InstallRestGateway(http.get(), core.get(), &call_metrics, &access.api);

  SchedulerServiceImpl service(core.get(), &call_metrics, access);
  int grpc_port = 0;
  ASSIGN_OR_RETURN(
      std::unique_ptr<grpc::Server> server,
      StartGrpcServer(absl::GetFlag(FLAGS_listen), &service, &grpc_port));
  RETURN_IF_ERROR(WritePortFile(absl::GetFlag(FLAGS_port_file),
                                {{"grpc", grpc_port}, {"http", http->port()}}));
  PT_LOG(INFO) << "pipetrain-scheduler serving gRPC on port " << grpc_port
               << ", REST and /metrics (" << (http->https() ? "HTTPS" : "HTTP")
               << ") on port " << http->port() << ", state in "
               << options.data_dir;
  const int signal = WaitForShutdownSignal();
  PT_LOG(INFO) << "signal " << signal << ": shutting down";
  server->Shutdown(DeadlineIn(5));
  http->Stop();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::BlockShutdownSignals();
  absl::SetProgramUsageMessage(
      "The pipetrain scheduler.\n"
      "  pipetrain-scheduler --listen 0.0.0.0:7000 --http_port 8080 "
      "--data_dir DIR");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pipetrain::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "pipetrain-scheduler: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
