// pipetrain-train: trains a job's whole model in this process (one stage).
// It is the reference the pipeline matches, and the quickest way to try a
// job spec.
//
//   pipetrain-train --job examples/fashion_mnist_mlp.job.json
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "worker/compute/backend.h"
#include "worker/pipeline/local_trainer.h"

ABSL_FLAG(std::string, job, "", "Training job spec (JSON), required");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda");
ABSL_FLAG(int, threads, 0, "CPU threads for BLAS and loops (0: all cores)");
ABSL_FLAG(int64_t, steps, 0, "Override the spec's number of steps");
ABSL_FLAG(int64_t, log_every, 100, "Print progress every this many steps");
ABSL_FLAG(double, min_accuracy, 0.0,
          "Exit with status 3 when the final test accuracy is below this");

namespace pipetrain {
namespace {

absl::Status Run() {
  const std::string job = absl::GetFlag(FLAGS_job);
  if (job.empty()) {
    return absl::InvalidArgumentError("--job is required (a JSON job spec)");
  }
  v1::TrainingSpec spec;
  RETURN_IF_ERROR(ReadJsonFile(job, &spec));
  if (absl::GetFlag(FLAGS_steps) > 0)
    spec.set_steps(absl::GetFlag(FLAGS_steps));

  BackendOptions options;
  ASSIGN_OR_RETURN(options.kind, ParseBackendKind(absl::GetFlag(FLAGS_device)));
  options.threads = absl::GetFlag(FLAGS_threads);
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(options));
  ASSIGN_OR_RETURN(std::unique_ptr<LocalTrainer> trainer,
                   LocalTrainer::Create(spec, backend.get()));
  std::printf(
      "job %s: %lld parameters, %lld steps (%lld per epoch), batch "
      "%lld in %lld micro-batches, on %s\n",
      spec.name().c_str(),
      static_cast<long long>(trainer->model()->num_parameters()),
      static_cast<long long>(trainer->total_steps()),
      static_cast<long long>(trainer->steps_per_epoch()),
      static_cast<long long>(spec.batch_size()),
      static_cast<long long>(std::max<int64_t>(1, spec.micro_batches())),
      backend->Describe().c_str());

  const int64_t log_every =
      std::max<int64_t>(1, absl::GetFlag(FLAGS_log_every));
  double window_loss = 0, window_acc = 0, window_secs = 0;
  int64_t window = 0;
  while (trainer->step() < trainer->total_steps()) {
    ASSIGN_OR_RETURN(StepReport r, trainer->Step());
    window_loss += r.loss;
    window_acc += r.accuracy;
    window_secs += r.seconds;
    ++window;
    const bool last = trainer->step() == trainer->total_steps();
    if (trainer->step() % log_every == 0 || last) {
      std::printf(
          "step %6lld/%lld  epoch %lld  %5.1f%%  loss %.4f  train acc %5.1f%%  "
          "%.0f samples/s\n",
          static_cast<long long>(trainer->step()),
          static_cast<long long>(trainer->total_steps()),
          static_cast<long long>(r.epoch),
          100.0 * trainer->step() / trainer->total_steps(),
          window_loss / window, 100.0 * window_acc / window,
          window * spec.batch_size() / std::max(window_secs, 1e-9));
      std::fflush(stdout);
      window_loss = window_acc = window_secs = 0;
      window = 0;
    }
    if (spec.eval_every() > 0 && trainer->step() % spec.eval_every() == 0 &&
        !last) {
      ASSIGN_OR_RETURN(EvalReport e, trainer->Evaluate(2000));
      std::printf("  eval (first %lld samples): loss %.4f  accuracy %.2f%%\n",
                  static_cast<long long>(e.samples), e.loss,
                  100.0 * e.accuracy);
    }
  }
  ASSIGN_OR_RETURN(EvalReport e, trainer->Evaluate());
  std::printf("test loss %.4f  test accuracy %.2f%% (%lld samples)\n", e.loss,
              100.0 * e.accuracy, static_cast<long long>(e.samples));
  if (e.accuracy < absl::GetFlag(FLAGS_min_accuracy)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("test accuracy %.4f is below --min_accuracy %.4f",
                        e.accuracy, absl::GetFlag(FLAGS_min_accuracy)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a job's whole model in this process.\n"
      "  pipetrain-train --job examples/fashion_mnist_mlp.job.json");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pipetrain::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "pipetrain-train: %s\n", status.ToString().c_str());
    return status.code() == absl::StatusCode::kFailedPrecondition ? 3 : 1;
  }
  return 0;
}
