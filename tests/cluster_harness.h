// Multi-process test harness: starts pipetrain binaries as child processes
// on loopback, waits until they serve, and talks to them over gRPC.
#ifndef PIPETRAIN_TESTS_CLUSTER_HARNESS_H_
#define PIPETRAIN_TESTS_CLUSTER_HARNESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/scheduler.grpc.pb.h"
#include "pipetrain/v1/stage.grpc.pb.h"

namespace pipetrain::testing {

// A child process that writes a port file (name=port lines) once it serves.
// Killed (SIGKILL) on destruction unless stopped before.
class ChildProcess {
 public:
  // Starts `binary` with `args` plus --port_file; waits up to `timeout_s`
  // for the port file. Its output goes to `log_path`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::string& binary, std::vector<std::string> args,
      double timeout_s = 60.0);
  ~ChildProcess();

  int port(const std::string& name) const;
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // Sends `signal` and waits for the process to exit; returns its status.
  int Signal(int signal);
  bool Running() const;

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  std::map<std::string, int> ports_;
  std::string dir_;
  std::string log_path_;
};

// Path of a built binary (set by CMake as PIPETRAIN_BIN_DIR).
std::string BinaryPath(const std::string& name);
// The repository root (PIPETRAIN_SOURCE_DIR).
std::string SourcePath(const std::string& relative);

// A stage worker child and a stub to it.
struct Worker {
  std::unique_ptr<ChildProcess> process;
  std::unique_ptr<v1::StageService::Stub> stub;
  std::string address;  // 127.0.0.1:port
};
absl::StatusOr<Worker> StartWorker(
    const std::vector<std::string>& extra_args = {});

// A scheduler child and a stub to it.
struct Scheduler {
  std::unique_ptr<ChildProcess> process;
  std::unique_ptr<v1::SchedulerService::Stub> stub;
  std::string address;  // gRPC, 127.0.0.1:port
  int http_port = 0;
};
absl::StatusOr<Scheduler> StartScheduler(
    const std::string& data_dir,
    const std::vector<std::string>& extra_args = {});

// A fresh directory under /tmp, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What a pipeline run on worker processes produced.
struct PipelineRun {
  absl::Status status;
  std::vector<double> losses;  // per step, from the last stage
  // Every stage's parameters in model (layer) order.
  std::vector<std::vector<float>> weights;
  std::vector<v1::GetStatusResponse> stages;  // final status per stage
};

struct PipelineOptions {
  v1::DType wire = v1::DTYPE_F32;
  // Quantized activations / gradients on the wire (none by default).
  v1::WireCompression wire_compression;
  v1::ScheduleKindProto schedule = v1::SCHEDULE_GPIPE;
  double timeout_s = 120;
  bool fetch_weights = true;
  // SCHEDULE_INTERLEAVED: chunks per worker (v); the cuts then give K * v
  // chunks, worker s holding chunks s, K + s, 2K + s, ...
  int virtual_stages = 1;
  // Resuming: every stage starts at this step.
  int64_t start_step = 0;
  // When set, stages are configured with restore_expected and this loads
  // each one's state (stage s on `worker`) after all are configured and
  // before any trains.
  std::function<absl::Status(Worker& worker, int stage)> restore;
};

// Configures workers [0, K) with `spec`'s model cut at `cuts` (layer
// indices; into K * options.virtual_stages chunks) and trains spec.steps()
// steps under job id `job`.
PipelineRun RunPipeline(std::vector<Worker>& workers, const std::string& job,
                        const v1::TrainingSpec& spec,
                        const std::vector<int>& cuts,
                        const PipelineOptions& options = {});

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_CLUSTER_HARNESS_H_
