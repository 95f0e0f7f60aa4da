// Fuzzes the scheduler's REST gateway in-process: the HTTP server's route
// matching and the gateway's path, query and body parsing, down to the
// SchedulerCore calls, with no network traffic (requests go straight to
// HttpServer::Dispatch). The core runs on FakeStageControl with three
// workers and one running job ("job-1"), so job routes find a real job;
// specs are validated by the scheduler's own SpecModelSupport.
//
// Input: up to four requests separated by NUL bytes, each
//   METHOD SP TARGET LF [Authorization: VALUE LF] BODY
// where TARGET is a path with an optional ?query. Routes are authorized by
// a token table of a viewer ("viewer-token") and an operator
// ("operator-token"). A fresh core per input keeps runs independent of
// each other.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "scheduler/fake_stage_control.h"
#include "scheduler/scheduler_core.h"
#include "services/auth/access_policy.h"
#include "services/http/http_server.h"
#include "services/scheduler/control_call_metrics.h"
#include "services/scheduler/rest_gateway.h"
#include "services/scheduler/scheduler_support.h"

namespace pipetrain {
namespace {

constexpr int kMaxRequests = 4;

// The scheduler side of one input.
struct Cluster {
  FakeStageControl control;
  SpecModelSupport model;
  MetricsRegistry registry;
  std::unique_ptr<SchedulerCore> core;
};

v1::JobSpec RunningJobSpec() {
  v1::JobSpec spec;
  spec.set_num_stages(3);
  v1::TrainingSpec* t = spec.mutable_training();
  t->set_batch_size(8);
  t->set_micro_batches(2);
  t->set_steps(100);
  v1::ModelSpec* m = t->mutable_model();
  m->set_input_kind(v1::INPUT_KIND_FLOAT);
  m->add_input_shape(4);
  m->set_loss(v1::LOSS_KIND_SOFTMAX_CROSS_ENTROPY);
  for (int i = 0; i < 3; ++i) {
    v1::LinearSpec* linear = m->add_layers()->mutable_linear();
    linear->set_in_features(4);
    linear->set_out_features(4);
  }
  return spec;
}

// Three idle workers and job-1 running on them; the control loop is the
// input's to drive (it never runs on its own).
std::unique_ptr<Cluster> StartCluster() {
  auto c = std::make_unique<Cluster>();
  c->control.SetEvaluateWait(std::chrono::milliseconds(50));
  SchedulerOptions options;
  options.control_thread = false;
  options.action_threads = false;
  options.now_ms = [] { return int64_t{1'000'000}; };
  auto core = SchedulerCore::Create(options, &c->control, &c->model, nullptr);
  if (!core.ok()) __builtin_trap();
  c->core = std::move(*core);
  std::vector<std::pair<std::string, std::string>> workers;
  for (int i = 0; i < 3; ++i) {
    v1::RegisterWorkerRequest r;
    r.mutable_worker()->set_address("10.0.0." + std::to_string(i) + ":7000");
    r.mutable_worker()->set_memory_bytes(int64_t{1} << 30);
    r.mutable_worker()->set_gemm_gflops(10);
    auto registered = c->core->RegisterWorker(r);
    if (!registered.ok()) __builtin_trap();
    v1::HeartbeatRequest h;
    h.set_worker_id(registered->worker_id());
    if (!c->core->Heartbeat(h).ok()) __builtin_trap();
  }
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = RunningJobSpec();
  if (!c->core->SubmitJob(submit).ok()) __builtin_trap();
  c->core->Tick();
  return c;
}

HttpRequest ParseRequest(absl::string_view text) {
  HttpRequest request;
  const size_t line_end = std::min(text.find('\n'), text.size());
  const absl::string_view line = text.substr(0, line_end);
  absl::string_view rest = text.substr(std::min(line_end + 1, text.size()));
  constexpr absl::string_view kAuth = "Authorization: ";
  if (absl::StartsWith(rest, kAuth)) {
    const size_t end = std::min(rest.find('\n'), rest.size());
    request.headers["authorization"] =
        std::string(rest.substr(kAuth.size(), end - kAuth.size()));
    rest = rest.substr(std::min(end + 1, rest.size()));
  }
  request.body = std::string(rest);
  const size_t space = std::min(line.find(' '), line.size());
  request.method = std::string(line.substr(0, space));
  absl::string_view target = line.substr(std::min(space + 1, line.size()));
  const size_t question = target.find('?');
  if (question != absl::string_view::npos) {
    request.query = std::string(target.substr(question + 1));
    target = target.substr(0, question);
  }
  request.path = std::string(target);
  return request;
}

HttpServer* Server() {
  static HttpServer* server = [] {
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.threads = 1;
    auto started = HttpServer::Start(options);
    if (!started.ok()) __builtin_trap();
    return started->release();
  }();
  return server;
}

}  // namespace
}  // namespace pipetrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  static MetricsRegistry* registry = new MetricsRegistry();
  static ControlCallMetrics* metrics = new ControlCallMetrics(registry);
  static ApiAuthorizer* auth = [] {
    auto tokens = TokenTable::Parse(
        "viewer-token viewer\noperator-token operator\n", "fuzz");
    if (!tokens.ok()) __builtin_trap();
    return new ApiAuthorizer(std::move(*tokens));
  }();
  std::unique_ptr<Cluster> cluster = StartCluster();
  HttpServer* server = Server();
  InstallRestGateway(server, cluster->core.get(), metrics, auth);
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  int n = 0;
  for (absl::string_view text : absl::StrSplit(input, '\0')) {
    if (++n > kMaxRequests) break;
    const HttpResponse response = server->Dispatch(ParseRequest(text));
    if (response.status < 200 || response.status > 599) __builtin_trap();
  }
  return 0;
}
