#include "services/ctl/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pipetrain {
namespace ctl {
namespace {

constexpr int kDefaultBarWidth = 20;
constexpr int kMinBarWidth = 10;
constexpr int kMaxBarWidth = 30;

// Strips an enum's prefix ("JOB_STATE_") from its generated name.
std::string EnumShortName(const std::string& full, const std::string& prefix,
                          int value) {
  if (full.empty()) return absl::StrCat("UNKNOWN(", value, ")");
  if (absl::StartsWith(full, prefix)) return full.substr(prefix.size());
  return full;
}

// Steps done, clamped to [0, total_steps]; integer math keeps the bar and
// the percentage exact.
int64_t StepsDone(const v1::Job& job) {
  return std::clamp<int64_t>(job.step(), 0, job.total_steps());
}

int64_t Percent(const v1::Job& job) {
  if (job.total_steps() <= 0) return 0;
  return StepsDone(job) * 100 / job.total_steps();
}

std::string Bar(const v1::Job& job, int inner) {
  const int64_t filled =
      job.total_steps() > 0 ? StepsDone(job) * inner / job.total_steps() : 0;
  return absl::StrCat("[", std::string(filled, '#'),
                      std::string(inner - filled, '-'), "]");
}

// " 60% step 1125/1875 epoch 1": always shown. The step is padded to the
// width of the total so the bar keeps its width as the step grows.
std::string CoreFields(const v1::Job& job) {
  std::string out;
  if (job.total_steps() > 0) {
    const int digits = static_cast<int>(absl::StrCat(job.total_steps()).size());
    out = absl::StrFormat("%3d%% step %*d/%d", Percent(job), digits, job.step(),
                          job.total_steps());
  } else {
    out = absl::StrFormat("%3d%% step %d", Percent(job), job.step());
  }
  absl::StrAppend(&out, " epoch ", job.epoch());
  return out;
}

// Dropped from the end when the terminal is narrow.
std::vector<std::string> OptionalFields(const v1::Job& job) {
  std::vector<std::string> fields;
  if (job.step() <= 0) return fields;
  fields.push_back(absl::StrFormat("loss %.4f", job.loss()));
  fields.push_back(absl::StrFormat("acc %.1f%%", 100 * job.accuracy()));
  fields.push_back(absl::StrFormat("%.0f samples/s", job.samples_per_second()));
  if (job.stages_size() > 0) {
    std::vector<std::string> busy;
    for (const v1::StageProgress& s : job.stages()) {
      busy.push_back(absl::StrFormat("%.0f%%", 100 * s.busy_fraction()));
    }
    fields.push_back(absl::StrCat("stages busy ", absl::StrJoin(busy, " ")));
  }
  return fields;
}

std::string Head(const v1::Job& job) {
  return absl::StrCat(job.id(), " ", JobStateName(job.state()));
}

// head [bar] core  opt1  opt2 ...; an empty bar is left out.
std::string Assemble(const std::string& head, const std::string& bar,
                     const std::string& core,
                     const std::vector<std::string>& optional, size_t keep) {
  std::string out = head;
  if (!bar.empty()) absl::StrAppend(&out, " ", bar);
  absl::StrAppend(&out, " ", core);
  for (size_t i = 0; i < keep && i < optional.size(); ++i) {
    absl::StrAppend(&out, "  ", optional[i]);
  }
  return out;
}

}  // namespace

std::string HumanizeBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  // Round first so 9.96 KiB reads "10 KiB", not "10.0 KiB".
  if (std::round(value * 10) / 10 < 10) {
    return absl::StrFormat("%.1f %s", value, kUnits[unit]);
  }
  return absl::StrFormat("%.0f %s", value, kUnits[unit]);
}

std::string HumanizeDuration(double seconds) {
  if (!(seconds > 0)) seconds = 0;
  if (seconds < 9.95) return absl::StrFormat("%.1fs", seconds);
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string JobStateName(v1::JobState state) {
  return EnumShortName(v1::JobState_Name(state), "JOB_STATE_", state);
}

std::string WorkerStateName(v1::WorkerState state) {
  return EnumShortName(v1::WorkerState_Name(state), "WORKER_STATE_", state);
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string FormatProgressLine(const v1::Job& job, int width) {
  const std::string head = Head(job);
  const std::string core = CoreFields(job);
  const std::vector<std::string> optional = OptionalFields(job);
  if (width <= 0) {
    return Assemble(head, Bar(job, kDefaultBarWidth), core, optional,
                    optional.size());
  }
  for (size_t keep = optional.size() + 1; keep-- > 0;) {
    const int without_bar =
        static_cast<int>(Assemble(head, "", core, optional, keep).size());
    // The bar costs its brackets and one separating space.
    const int inner = std::min(kMaxBarWidth, width - without_bar - 3);
    if (inner >= kMinBarWidth) {
      return Assemble(head, Bar(job, inner), core, optional, keep);
    }
  }
  std::string bare = Assemble(head, "", core, optional, 0);
  if (static_cast<int>(bare.size()) > width) bare.resize(width);
  return bare;
}

std::string FormatFinalSummary(const v1::Job& job) {
  const std::string steps = absl::StrCat(job.step(), "/", job.total_steps());
  std::string out;
  switch (job.state()) {
    case v1::JOB_STATE_COMPLETED:
      out = absl::StrFormat("%s COMPLETED after %s steps, final loss %.4f",
                            job.id(), steps, job.loss());
      break;
    case v1::JOB_STATE_FAILED:
      out = absl::StrFormat(
          "%s FAILED at step %s: %s", job.id(), steps,
          job.error().empty() ? "no error message given" : job.error());
      break;
    default:
      out = absl::StrFormat("%s %s at step %s", job.id(),
                            JobStateName(job.state()), steps);
      if (job.step() > 0) {
        absl::StrAppendFormat(&out, ", last loss %.4f", job.loss());
      }
  }
  if (job.has_eval() && job.eval().samples() > 0) {
    absl::StrAppendFormat(&out, "\ntest accuracy %.1f%% on %d samples",
                          100 * job.eval().accuracy(), job.eval().samples());
    absl::StrAppendFormat(&out, " (loss %.4f)", job.eval().loss());
  }
  return out;
}

}  // namespace ctl
}  // namespace pipetrain
