// pipetrainctl: the user's command line for the scheduler.
//
//   pipetrainctl submit examples/fashion_mnist_mlp.job.json --watch
//   pipetrainctl jobs
//   pipetrainctl --output=json get job-3
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "services/auth/security_flags.h"
#include "services/ctl/commands.h"
#include "services/ctl/job_input.h"

ABSL_FLAG(std::string, scheduler, "",
          "Scheduler address host:port (default: $PIPETRAIN_SCHEDULER, else "
          "localhost:7000)");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token for the scheduler (default: "
          "$PIPETRAIN_TOKEN)");
ABSL_FLAG(double, timeout, 10, "Deadline of each call, in seconds");
ABSL_FLAG(std::string, output, "table", "table or json");
ABSL_FLAG(bool, watch, false, "submit: keep watching the job");
ABSL_FLAG(double, min_accuracy, 0,
          "watch: exit 3 when the completed job's test accuracy is below this");
ABSL_FLAG(int, stages, -1,
          "submit: stages to cut the model into (0: let the planner choose; "
          "-1: as in the spec)");
ABSL_FLAG(std::string, schedule, "",
          "submit: gpipe, 1f1b-flush, zb-h1, 1f1b-async or interleaved "
          "(default: as in "
          "the spec)");
ABSL_FLAG(std::string, wire, "",
          "submit: f32, bf16 or f16 activations on the wire (default: as in "
          "the spec)");
ABSL_FLAG(std::string, wire_compression, "",
          "submit: none, int8 or int4 activations and gradients on the wire "
          "(quantized; default: as in the spec)");
ABSL_FLAG(int64_t, since, 0, "versions: history from this step on");
ABSL_FLAG(bool, links, false,
          "workers: the measured link matrix (bandwidth, RTT) between them");
ABSL_FLAG(int64_t, steps, 5, "trace: how many recent steps to export");
ABSL_FLAG(std::string, out, "",
          "trace: write the Chrome trace JSON here; export: the model file");
ABSL_FLAG(int64_t, version, 0,
          "export: the checkpoint version to export (0: the latest)");
ABSL_FLAG(int64_t, samples, 0, "evaluate: held-out samples (0: all)");

namespace pipetrain {
namespace ctl {
namespace {

constexpr char kDefaultScheduler[] = "localhost:7000";

std::string SchedulerAddress() {
  std::string address = absl::GetFlag(FLAGS_scheduler);
  if (!address.empty()) return address;
  const char* env = std::getenv("PIPETRAIN_SCHEDULER");
  return env != nullptr && env[0] != '\0' ? env : kDefaultScheduler;
}

// --token_file, else $PIPETRAIN_TOKEN, else none.
std::string TokenFromFlags(std::string* problem) {
  const std::string file = absl::GetFlag(FLAGS_token_file);
  if (!file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile("token_file", file);
    if (!token.ok()) *problem = std::string(token.status().message());
    return token.ok() ? *token : "";
  }
  const char* env = std::getenv("PIPETRAIN_TOKEN");
  return env != nullptr ? env : "";
}

// Fills `options` from the flags; a usage problem, or empty.
std::string OptionsFromFlags(CtlOptions* options) {
  options->scheduler = SchedulerAddress();
  std::string problem;
  options->token = TokenFromFlags(&problem);
  if (!problem.empty()) return problem;
  const absl::StatusOr<TransportSecurity> security =
      SetUpTransportSecurityFromFlags({{"--scheduler", options->scheduler}},
                                      /*client=*/true);
  if (!security.ok()) return std::string(security.status().message());
  options->timeout_seconds = absl::GetFlag(FLAGS_timeout);
  if (!(options->timeout_seconds > 0)) return "--timeout must be positive";
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "table" && output != "json") {
    return absl::StrCat("--output must be table or json, not '", output, "'");
  }
  options->json = output == "json";
  options->watch = absl::GetFlag(FLAGS_watch);
  options->min_accuracy = absl::GetFlag(FLAGS_min_accuracy);
  JobOverrides& overrides = options->overrides;
  if (absl::GetFlag(FLAGS_stages) != -1) {
    overrides.num_stages = absl::GetFlag(FLAGS_stages);
  }
  if (!absl::GetFlag(FLAGS_schedule).empty()) {
    overrides.schedule = absl::GetFlag(FLAGS_schedule);
  }
  if (!absl::GetFlag(FLAGS_wire).empty()) {
    overrides.wire = absl::GetFlag(FLAGS_wire);
  }
  if (!absl::GetFlag(FLAGS_wire_compression).empty()) {
    overrides.wire_compression = absl::GetFlag(FLAGS_wire_compression);
  }
  // Checked here so a bad value is a usage error before any call.
  v1::JobSpec scratch;
  const absl::Status valid = ApplyJobOverrides(overrides, &scratch);
  if (!valid.ok()) return std::string(valid.message());
  options->since_step = absl::GetFlag(FLAGS_since);
  options->links = absl::GetFlag(FLAGS_links);
  options->eval_samples = absl::GetFlag(FLAGS_samples);
  options->trace_steps = absl::GetFlag(FLAGS_steps);
  options->trace_out = absl::GetFlag(FLAGS_out);
  options->export_version = absl::GetFlag(FLAGS_version);
  return "";
}

}  // namespace
}  // namespace ctl
}  // namespace pipetrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(pipetrain::ctl::UsageText());
  // --help lists this file's flags (absl looks for pipetrainctl.cc).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::StrContains(path, "ctl_main.cc") ||
           absl::StrContains(path, "security_flags.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  pipetrain::ctl::CtlOptions options;
  const std::string problem = pipetrain::ctl::OptionsFromFlags(&options);
  if (!problem.empty()) return pipetrain::ctl::UsageError(problem);
  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  return pipetrain::ctl::RunCommand(args, options);
}
