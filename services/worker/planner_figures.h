// The figures a worker measures of itself when it starts and reports at
// registration for the planner (WorkerInfo: message_overhead_seconds,
// message_cpu_seconds, message_cpu_seconds_per_byte, stream_hop_seconds,
// host_cpus), also served as gauges on its /metrics: an operator sees what
// the scheduler was told, and a caller that plans without a scheduler
// (bench_scaling) reads the same figures back. The one place that names
// these gauges.
#ifndef PIPETRAIN_SERVICES_WORKER_PLANNER_FIGURES_H_
#define PIPETRAIN_SERVICES_WORKER_PLANNER_FIGURES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/metrics_registry.h"
#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {

// Sets a gauge for each of `info`'s planner figures that was measured
// (non-zero); one not measured has no gauge. The registry's errors.
absl::Status ExportPlannerFigures(const v1::WorkerInfo& info,
                                  MetricsRegistry* registry);

// Reads those gauges from a /metrics text (Prometheus text format) into
// `info`, leaving a field whose gauge is absent unset. InvalidArgument
// naming the gauge when a value is not a finite number >= 0.
absl::Status ReadPlannerFigures(absl::string_view metrics_text,
                                v1::WorkerInfo* info);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_PLANNER_FIGURES_H_
