// Pure text formatting for pipetrainctl's `watch`: the one-line progress
// view of a job, its final summary, and the humanized units both use.
//
// Everything here is a pure function of its arguments (no clock, no
// terminal), so tests can pin exact strings. Thread-safe.
#ifndef PIPETRAIN_SERVICES_CTL_PROGRESS_BAR_H_
#define PIPETRAIN_SERVICES_CTL_PROGRESS_BAR_H_

#include <cstdint>
#include <string>

#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {
namespace ctl {

// 512 -> "512 B", 1536 -> "1.5 KiB", 16 GiB -> "16 GiB" (binary units; one
// decimal below 10, none above).
std::string HumanizeBytes(int64_t bytes);

// 0.4 -> "0.4s", 42 -> "42s", 185 -> "3m05s", 7830 -> "2h10m",
// 277200 -> "3d05h". Negative durations read as 0.
std::string HumanizeDuration(double seconds);

// "RUNNING" for JOB_STATE_RUNNING; "UNKNOWN(9)" for values this build does
// not know.
std::string JobStateName(v1::JobState state);
std::string WorkerStateName(v1::WorkerState state);

// COMPLETED, FAILED or CANCELLED: `watch` stops there.
bool IsTerminal(v1::JobState state);

// The live progress line, e.g.
//   job-3 RUNNING [############--------]  60% step 1125/1875 epoch 1  loss
//   0.4123  acc 85.2%  1830 samples/s  stages busy 81% 77% 90%
// (one line). With width > 0 the line never exceeds `width` characters:
// the bar shrinks first, then trailing fields are dropped, then the text is
// cut. With width <= 0 (not a terminal) the bar has its default width.
// Loss, accuracy and throughput appear once the job has taken a step.
std::string FormatProgressLine(const v1::Job& job, int width);

// What `watch` prints when the job ends, one or two lines without a trailing
// newline, e.g.
//   job-3 COMPLETED after 1875/1875 steps, final loss 0.3123
//   test accuracy 86.9% on 10000 samples (loss 0.3712)
std::string FormatFinalSummary(const v1::Job& job);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_PROGRESS_BAR_H_
