// The table and detail views pipetrainctl prints for the scheduler's
// answers (the `--output=table` side; JSON output is the messages as they
// are). Pure functions of the message and of `now_unix_ms` (for ages), so
// tests pin exact text. Thread-safe.
#ifndef PIPETRAIN_SERVICES_CTL_VIEWS_H_
#define PIPETRAIN_SERVICES_CTL_VIEWS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {
namespace ctl {

// Every returned text ends in '\n'.

// ID NAME STATE STEP PROGRESS LOSS ACC SAMPLES/S STAGES AGE; "no jobs".
std::string FormatJobsTable(const v1::ListJobsResponse& jobs,
                            int64_t now_unix_ms);

// ID ADDRESS STATE DEVICE ZONE GFLOP/S MEMORY JOB/STAGE HEARTBEAT;
// "no workers registered".
std::string FormatWorkersTable(const v1::ListWorkersResponse& workers,
                               int64_t now_unix_ms);

// `get`: key/value lines (the latest evaluation among them), a table of the
// stages, then the last kMaxEvaluationRows evaluations when there are
// several (periodic ones), then the last kMaxEventRows events.
std::string FormatJobDetail(const v1::Job& job, int64_t now_unix_ms);

// `workers --links`: the link matrix, one row per sending worker and one
// column per receiving one; each cell the bandwidth (Mb/s or Gb/s) and
// round-trip time (ms) as measured, "*" where the scheduler's flags set
// it, "-" where nothing is known.
std::string FormatLinksMatrix(const v1::ListWorkersResponse& workers);
// 12.3 Mb/s, 1.25 Gb/s (bits).
std::string FormatBandwidth(double bytes_per_s);
inline constexpr int kMaxEvaluationRows = 10;
inline constexpr int kMaxEventRows = 20;

// JOB_EVENT_WORKER_LOST -> "worker lost".
std::string EventKindName(v1::JobEventKind kind);

// "job-3 recovered at step 40: resumed at step 40 from version 40 (2.31
// s)", one line without a newline: what `watch` prints as an event arrives.
std::string FormatEventLine(const std::string& job_id,
                            const v1::JobEvent& event);

// `plan`: a table of the stages (with the link to the next stage and the
// bytes a micro-batch sends over it), then the bottleneck, the predicted
// step and bubble, the measured step beside it with the prediction's
// error, and the planner's explanation.
std::string FormatPlan(const v1::Plan& plan);

// `versions`: the committed version, per-stage versions, and the last
// `max_history` entries of the history.
std::string FormatVersions(const v1::GetVersionsResponse& versions,
                           int64_t since_step, int64_t now_unix_ms,
                           size_t max_history);

// `checkpoints`: VERSION STEP SIZE LAYERS WRITTEN-IN AGE; "no checkpoints".
std::string FormatCheckpoints(const v1::ListCheckpointsResponse& checkpoints,
                              int64_t now_unix_ms);

// "test accuracy 86.9% on 10000 samples (loss 0.3712) at step 1875".
std::string FormatEvalResult(const v1::EvalResult& eval);

// "job-3 evaluation at step 400: loss 0.4123, test accuracy 85.2% on 10000
// samples", one line without a newline: what `watch` prints as an
// evaluation arrives.
std::string FormatEvalLine(const std::string& job_id,
                           const v1::EvalResult& eval);

// "job-3 PAUSED at step 120/1875": what pause, resume and cancel print.
std::string FormatJobState(const v1::Job& job);

// 0.0123 -> "12.30 ms", 0.45 -> "450.0 ms", 2.5 -> "2.50 s".
std::string FormatSeconds(double seconds);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_VIEWS_H_
