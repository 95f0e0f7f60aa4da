#include "tests/cluster_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain::testing {

std::string BinaryPath(const std::string& name) {
  const char* dir = std::getenv("PIPETRAIN_BIN_DIR");
  return absl::StrCat(dir != nullptr ? dir : PIPETRAIN_DEFAULT_BIN_DIR, "/",
                      name);
}

std::string SourcePath(const std::string& relative) {
  const char* dir = std::getenv("PIPETRAIN_SOURCE_DIR");
  return absl::StrCat(dir != nullptr ? dir : PIPETRAIN_DEFAULT_SOURCE_DIR, "/",
                      relative);
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::string& binary, std::vector<std::string> args,
    double timeout_s) {
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  char pattern[] = "/tmp/pipetrain-test-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp failed");
  }
  child->dir_ = pattern;
  const std::string port_file = child->dir_ + "/ports";
  child->log_path_ = child->dir_ + "/log";
  args.insert(args.begin(), binary);
  args.push_back("--port_file=" + port_file);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd =
        open(child->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    // The child must not outlive the test run.
    setpgid(0, 0);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  child->pid_ = pid;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    if (in) {
      std::string line;
      while (std::getline(in, line)) {
        const size_t eq = line.find('=');
        int port = 0;
        if (eq != std::string::npos &&
            absl::SimpleAtoi(line.substr(eq + 1), &port)) {
          child->ports_[line.substr(0, eq)] = port;
        }
      }
      return child;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      child->pid_ = -1;
      std::ifstream log(child->log_path_);
      std::stringstream text;
      text << log.rdbuf();
      return absl::InternalError(
          absl::StrCat(binary, " exited early: ", text.str()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(binary + " did not start in time");
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Signal(SIGKILL);
  if (!dir_.empty()) {
    std::remove((dir_ + "/ports").c_str());
    std::remove(log_path_.c_str());
    rmdir(dir_.c_str());
  }
}

int ChildProcess::port(const std::string& name) const {
  auto it = ports_.find(name);
  return it == ports_.end() ? -1 : it->second;
}

int ChildProcess::Signal(int signal) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

bool ChildProcess::Running() const { return pid_ > 0 && kill(pid_, 0) == 0; }

absl::StatusOr<Worker> StartWorker(const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics_port=0",
                                   "--metrics_host=127.0.0.1", "--threads=1",
                                   "--device=cpu"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto process = ChildProcess::Start(BinaryPath("pipetrain-worker"), args);
  if (!process.ok()) return process.status();
  Worker w;
  w.address = absl::StrCat("127.0.0.1:", (*process)->port("grpc"));
  w.stub = v1::StageService::NewStub(CreatePipetrainChannel(w.address));
  w.process = std::move(*process);
  return w;
}

absl::StatusOr<Scheduler> StartScheduler(
    const std::string& data_dir, const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--http_port=0",
                                   "--http_host=127.0.0.1",
                                   "--data_dir=" + data_dir};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto process = ChildProcess::Start(BinaryPath("pipetrain-scheduler"), args);
  if (!process.ok()) return process.status();
  Scheduler s;
  s.address = absl::StrCat("127.0.0.1:", (*process)->port("grpc"));
  s.http_port = (*process)->port("http");
  s.stub = v1::SchedulerService::NewStub(CreatePipetrainChannel(s.address));
  s.process = std::move(*process);
  return s;
}

TempDir::TempDir() {
  char pattern[] = "/tmp/pipetrain-test-XXXXXX";
  if (mkdtemp(pattern) != nullptr) path_ = pattern;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  const std::string command = "rm -rf '" + path_ + "'";
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "could not remove %s\n", path_.c_str());
  }
}

namespace {

absl::Status Call(const grpc::Status& status) { return FromGrpcStatus(status); }

// Polls every stage until all are done (or one failed / time runs out).
absl::Status AwaitStages(std::vector<Worker>& workers, int k,
                         const std::string& job, double timeout_s,
                         PipelineRun* out) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  while (true) {
    out->stages.assign(k, v1::GetStatusResponse());
    bool done = true;
    for (int s = 0; s < k; ++s) {
      v1::GetStatusRequest request;
      request.set_job_id(job);
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(10));
      v1::GetStatusResponse& status = out->stages[s];
      absl::Status rpc =
          Call(workers[s].stub->GetStatus(&ctx, request, &status));
      if (!rpc.ok()) return rpc;
      if (status.state() == v1::STAGE_STATE_FAILED) {
        return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat("stage ", s, ": ", status.error()));
      }
      if (status.state() != v1::STAGE_STATE_DONE) done = false;
    }
    if (done) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("the pipeline did not finish in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

PipelineRun RunPipeline(std::vector<Worker>& workers, const std::string& job,
                        const v1::TrainingSpec& spec,
                        const std::vector<int>& cuts,
                        const PipelineOptions& options) {
  PipelineRun out;
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(spec.model().layers_size());
  const int v = std::max(1, options.virtual_stages);
  const int chunks = static_cast<int>(bounds.size()) - 1;
  const int k = chunks / v;
  if (chunks % v != 0) {
    out.status = absl::InvalidArgumentError("cuts do not give K * v chunks");
    return out;
  }
  if (k > static_cast<int>(workers.size())) {
    out.status = absl::InvalidArgumentError("more stages than workers");
    return out;
  }
  for (int s = k - 1; s >= 0; --s) {
    v1::ConfigureRequest request;
    v1::StageConfig* c = request.mutable_config();
    c->set_job_id(job);
    *c->mutable_spec() = spec;
    c->set_stage(s);
    c->set_num_stages(k);
    c->set_layer_begin(bounds[s]);
    c->set_layer_end(bounds[s + 1]);
    if (s + 1 < k) c->set_downstream(workers[s + 1].address);
    if (v > 1) {
      // Virtual stage j = c * K + s; the last worker wraps to worker 0.
      c->set_virtual_stages(v);
      for (int chunk = 0; chunk < v; ++chunk) {
        v1::LayerRange* range = c->add_chunks();
        range->set_begin(bounds[chunk * k + s]);
        range->set_end(bounds[chunk * k + s + 1]);
      }
      c->set_downstream(workers[(s + 1) % k].address);
    }
    c->set_wire_dtype(options.wire);
    *c->mutable_wire_compression() = options.wire_compression;
    c->set_schedule(options.schedule);
    c->set_recv_timeout_s(60);
    c->set_start_step(options.start_step);
    c->set_restore_expected(options.restore != nullptr);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(60));
    v1::ConfigureResponse response;
    out.status = Call(workers[s].stub->Configure(&ctx, request, &response));
    if (!out.status.ok()) return out;
  }
  for (int s = 0; s < k && options.restore != nullptr; ++s) {
    out.status = options.restore(workers[s], s);
    if (!out.status.ok()) return out;
  }
  for (int s = k - 1; s >= 0; --s) {
    v1::TrainRequest request;
    request.set_job_id(job);
    request.set_until_step(spec.steps());
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    v1::TrainResponse response;
    out.status = Call(workers[s].stub->Train(&ctx, request, &response));
    if (!out.status.ok()) return out;
  }
  out.status = AwaitStages(workers, k, job, options.timeout_s, &out);
  if (!out.status.ok()) return out;
  for (const auto& r : out.stages.back().results())
    out.losses.push_back(r.loss());
  if (!options.fetch_weights) return out;
  std::vector<std::pair<int, std::vector<float>>> by_layer;
  for (int s = 0; s < k; ++s) {
    v1::GetWeightsRequest request;
    request.set_job_id(job);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    v1::GetWeightsResponse response;
    out.status = Call(workers[s].stub->GetWeights(&ctx, request, &response));
    if (!out.status.ok()) return out;
    for (const auto& t : response.weights()) {
      const float* f = reinterpret_cast<const float*>(t.data().data());
      // Parameters are named "layers.<index>.<name>".
      int layer = 0;
      const std::vector<std::string> parts = absl::StrSplit(t.name(), '.');
      if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &layer)) {
        out.status = absl::InternalError(
            absl::StrCat("unexpected parameter name ", t.name()));
        return out;
      }
      by_layer.emplace_back(
          layer, std::vector<float>(f, f + t.data().size() / sizeof(float)));
    }
  }
  // Interleaved workers hold non-adjacent chunks: back to model order.
  std::stable_sort(
      by_layer.begin(), by_layer.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [layer, weights] : by_layer)
    out.weights.push_back(std::move(weights));
  return out;
}

}  // namespace pipetrain::testing
