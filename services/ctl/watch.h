// `pipetrainctl watch`: follows a job until it ends, redrawing one progress
// line on a terminal or printing a line every few seconds into a log.
#ifndef PIPETRAIN_SERVICES_CTL_WATCH_H_
#define PIPETRAIN_SERVICES_CTL_WATCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/ctl/scheduler_client.h"

namespace pipetrain {
namespace ctl {

struct WatchOptions {
  // Print only the final Job as JSON.
  bool json = false;
  double poll_seconds = 0.5;
  // Seconds between lines when stdout is not a terminal.
  double log_every_seconds = 5;
  // How long a scheduler that answered before may stay unreachable.
  double reconnect_grace_seconds = 30;
  // A completed job whose evaluation accuracy is below this exits with
  // kExitBelowAccuracy (0 disables the check).
  double min_accuracy = 0;
};

// Exit codes of a watch that ran to its end.
inline constexpr int kExitJobCompleted = 0;
inline constexpr int kExitJobFailed = 2;
inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitBelowAccuracy = 3;

// Which evaluations `watch` prints as their own lines: on its first look at
// a job the latest one, then every one that arrives (Job.evaluations only
// grows), as FormatEvalLine text. A job that ended prints none: its final
// summary shows the result. Not thread-safe; owned by one watch.
class EvaluationFeed {
 public:
  std::vector<std::string> NewLines(const v1::Job& job);

 private:
  bool looked_ = false;
  int seen_ = 0;
};

// Which events `watch` prints as their own lines: none of those that
// happened before its first look, then every one that arrives (recoveries,
// checkpoints, re-plans), as FormatEventLine text. Not thread-safe; owned
// by one watch.
class EventFeed {
 public:
  std::vector<std::string> NewLines(const v1::Job& job);

 private:
  bool looked_ = false;
  // The newest event seen (events are bounded, so counts may not grow).
  int64_t last_unix_ms_ = 0;
  int seen_at_last_ms_ = 0;
};

// Polls GetJob until the job is COMPLETED (returns 0), FAILED or CANCELLED
// (2), or the user presses Ctrl-C (130; the job keeps running). Each new
// evaluation and event gets a line of its own (EvaluationFeed, EventFeed). A
// failed call is returned as its status, except that a scheduler that has
// answered before may be unreachable for up to reconnect_grace_seconds. Call
// from the main thread: installs a SIGINT handler while it runs.
absl::StatusOr<int> WatchJob(SchedulerClient* client, const std::string& job_id,
                             const WatchOptions& options);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_WATCH_H_
