// pipetrainctl's commands: parsing the positional arguments, calling the
// scheduler, printing tables or JSON, and the exit codes. main() only turns
// flags into CtlOptions.
#ifndef PIPETRAIN_SERVICES_CTL_COMMANDS_H_
#define PIPETRAIN_SERVICES_CTL_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "services/ctl/job_input.h"

namespace pipetrain {
namespace ctl {

inline constexpr int kExitError = 1;
// EX_USAGE of sysexits.h: unknown command, missing or extra argument.
inline constexpr int kExitUsage = 64;

struct CtlOptions {
  // host:port of the scheduler.
  std::string scheduler;
  // Bearer token for the control API; empty when none.
  std::string token;
  double timeout_seconds = 10;
  bool json = false;
  // submit: keep watching the job.
  bool watch = false;
  // watch / submit --watch: fail (exit 3) below this eval accuracy.
  double min_accuracy = 0;
  // submit: flag overrides of the spec.
  JobOverrides overrides;
  // workers: print the link matrix instead of the table.
  bool links = false;
  // versions: history from this step on.
  int64_t since_step = 0;
  // evaluate: held-out samples (0: all).
  int64_t eval_samples = 0;
  // trace: recent steps to export, and the file to write (stdout if empty).
  int64_t trace_steps = 5;
  std::string trace_out;
  // export: the checkpoint version (0: the latest); the file is trace_out
  // (--out).
  int64_t export_version = 0;
};

// The help text: commands, their arguments and the global flags.
std::string UsageText();

// Prints "pipetrainctl: <problem>" and the usage text on stderr; returns
// kExitUsage.
int UsageError(const std::string& problem);

// Runs the command in `args` (the positional arguments, command first) and
// returns the process exit code: 0 on success, 1 on an error (one line on
// stderr), 2 when a watched job failed or was cancelled, 64 on a usage
// error (with the usage text), 130 when a watch was interrupted.
// Call from the main thread.
int RunCommand(const std::vector<std::string>& args, const CtlOptions& options);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_COMMANDS_H_
