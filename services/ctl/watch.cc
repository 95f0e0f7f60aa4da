#include "services/ctl/watch.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/elapsed.h"
#include "common/proto_json.h"
#include "services/ctl/progress_bar.h"
#include "services/ctl/views.h"

namespace pipetrain {
namespace ctl {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;

void OnInterrupt(int) { g_interrupted = 1; }

// Routes Ctrl-C to g_interrupted while it lives, then restores the previous
// handler, so an interrupted watch can say how to cancel the job.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = 0;
    previous_ = std::signal(SIGINT, OnInterrupt);
  }
  ~InterruptScope() { std::signal(SIGINT, previous_); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  void (*previous_)(int);
};

// Sleeps in short slices; false as soon as Ctrl-C was pressed.
bool SleepUnlessInterrupted(double seconds) {
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(seconds));
  while (!g_interrupted && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return !g_interrupted;
}

int TerminalWidth() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  int columns = 0;
  const char* env = std::getenv("COLUMNS");
  if (env != nullptr && absl::SimpleAtoi(env, &columns) && columns > 0) {
    return columns;
  }
  return 80;
}

bool IsTransportFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

// Draws progress on stdout: one redrawn line on a terminal, a line every
// `log_every` seconds (or on a state change) otherwise.
// Not thread-safe; owned by WatchJob.
class ProgressDisplay {
 public:
  ProgressDisplay(bool tty, double log_every)
      : tty_(tty), log_every_(log_every) {}

  void Show(const v1::Job& job) {
    // A line right after a note shows the recovery.
    const bool recovered = !note_.empty();
    note_.clear();
    if (tty_) return Redraw(FormatProgressLine(job, TerminalWidth() - 1));
    const bool due = !logged_ || recovered || job.state() != logged_state_ ||
                     SecondsSince(last_log_) >= log_every_;
    if (!due) return;
    std::printf("%s\n", FormatProgressLine(job, 0).c_str());
    std::fflush(stdout);
    logged_ = true;
    logged_state_ = job.state();
    last_log_ = Clock::now();
  }

  // A line that stays (an evaluation): on a terminal it ends the progress
  // line, which the next Show draws again below it.
  void Permanent(const std::string& text) {
    EndLine();
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }

  // A passing condition ("retrying"); printed once per occurrence in logs.
  void Note(const std::string& text) {
    if (tty_) return Redraw(text);
    if (text == note_) return;
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
    note_ = text;
  }

  void Finish(const v1::Job& job) {
    if (tty_) {
      Redraw(FormatProgressLine(job, TerminalWidth() - 1));
      EndLine();
    } else {
      std::printf("%s\n", FormatProgressLine(job, 0).c_str());
    }
    std::printf("%s\n", FormatFinalSummary(job).c_str());
    std::fflush(stdout);
  }

  // Ends a redrawn line so that what follows starts on its own.
  void EndLine() {
    if (!line_open_) return;
    std::printf("\n");
    std::fflush(stdout);
    line_open_ = false;
  }

 private:
  void Redraw(const std::string& line) {
    std::printf("\r%s\x1b[K", line.c_str());
    std::fflush(stdout);
    line_open_ = true;
  }

  const bool tty_;
  const double log_every_;
  bool line_open_ = false;
  bool logged_ = false;
  v1::JobState logged_state_ = v1::JOB_STATE_UNSPECIFIED;
  Clock::time_point last_log_;
  std::string note_;
};

int ExitCodeFor(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED ? kExitJobCompleted : kExitJobFailed;
}

int StopWatching(ProgressDisplay* display, const std::string& job_id) {
  display->EndLine();
  std::fprintf(stderr,
               "stopped watching %s; the job keeps running (cancel it with: "
               "pipetrainctl cancel %s)\n",
               job_id.c_str(), job_id.c_str());
  return kExitInterrupted;
}

}  // namespace

std::vector<std::string> EventFeed::NewLines(const v1::Job& job) {
  std::vector<std::string> lines;
  // Events are appended in time order; the ones newer than the newest seen
  // (or as new, past those already seen at that instant) are new.
  int at_last = 0;
  for (const v1::JobEvent& e : job.events()) {
    if (e.unix_ms() < last_unix_ms_) continue;
    if (e.unix_ms() == last_unix_ms_ && at_last++ < seen_at_last_ms_) continue;
    if (looked_) lines.push_back(FormatEventLine(job.id(), e));
  }
  if (job.events_size() > 0) {
    const int64_t newest = job.events().rbegin()->unix_ms();
    int n = 0;
    for (const v1::JobEvent& e : job.events()) n += e.unix_ms() == newest;
    last_unix_ms_ = newest;
    seen_at_last_ms_ = n;
  }
  looked_ = true;
  return lines;
}

std::vector<std::string> EvaluationFeed::NewLines(const v1::Job& job) {
  std::vector<std::string> lines;
  const int n = job.evaluations_size();
  if (IsTerminal(job.state())) {
    seen_ = n;
  } else if (!looked_) {
    if (n > 0)
      lines.push_back(FormatEvalLine(job.id(), job.evaluations(n - 1)));
  } else {
    for (int i = std::min(seen_, n); i < n; ++i) {
      lines.push_back(FormatEvalLine(job.id(), job.evaluations(i)));
    }
  }
  looked_ = true;
  seen_ = n;
  return lines;
}

absl::StatusOr<int> WatchJob(SchedulerClient* client, const std::string& job_id,
                             const WatchOptions& options) {
  InterruptScope interrupts;
  ProgressDisplay display(!options.json && isatty(STDOUT_FILENO) == 1,
                          options.log_every_seconds);
  EvaluationFeed evaluations;
  EventFeed events;
  bool answered = false;
  Clock::time_point last_answer = Clock::now();
  while (true) {
    absl::StatusOr<v1::Job> job = client->GetJob(job_id);
    if (g_interrupted) return StopWatching(&display, job_id);
    if (job.ok()) {
      answered = true;
      last_answer = Clock::now();
      if (IsTerminal(job->state())) {
        if (options.json) {
          std::printf("%s\n", ToJson(*job).c_str());
        } else {
          display.Finish(*job);
        }
        if (job->state() == v1::JOB_STATE_COMPLETED &&
            options.min_accuracy > 0 &&
            job->eval().accuracy() < options.min_accuracy) {
          std::fprintf(stderr,
                       "pipetrainctl: test accuracy %.4f is below "
                       "--min_accuracy %.4f\n",
                       job->eval().accuracy(), options.min_accuracy);
          return kExitBelowAccuracy;
        }
        return ExitCodeFor(job->state());
      }
      if (!options.json) {
        for (const std::string& line : events.NewLines(*job)) {
          display.Permanent(line);
        }
        for (const std::string& line : evaluations.NewLines(*job)) {
          display.Permanent(line);
        }
        display.Show(*job);
      }
    } else if (answered && IsTransportFailure(job.status()) &&
               SecondsSince(last_answer) < options.reconnect_grace_seconds) {
      if (!options.json) {
        display.Note(absl::StrFormat(
            "%s: scheduler at %s unreachable; retrying for up to %gs", job_id,
            client->target(), options.reconnect_grace_seconds));
      }
    } else {
      display.EndLine();
      return job.status();
    }
    if (!SleepUnlessInterrupted(options.poll_seconds)) {
      return StopWatching(&display, job_id);
    }
  }
}

}  // namespace ctl
}  // namespace pipetrain
