#include "services/worker/planner_figures.h"

#include <cmath>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// One planner figure: its gauge and its WorkerInfo field.
struct Figure {
  const char* name;
  const char* help;
  std::function<double(const v1::WorkerInfo&)> get;
  std::function<void(double, v1::WorkerInfo*)> set;
};

const Figure kFigures[] = {
    {"pipetrain_worker_message_overhead_seconds",
     "The wait one message end costs on this worker's own gRPC stack, "
     "measured at start (WorkerInfo.message_overhead_seconds)",
     [](const v1::WorkerInfo& i) { return i.message_overhead_seconds(); },
     [](double v, v1::WorkerInfo* i) { i->set_message_overhead_seconds(v); }},
    {"pipetrain_worker_message_cpu_seconds",
     "CPU (every thread) one stage-stream message end takes, measured at "
     "start (WorkerInfo.message_cpu_seconds)",
     [](const v1::WorkerInfo& i) { return i.message_cpu_seconds(); },
     [](double v, v1::WorkerInfo* i) { i->set_message_cpu_seconds(v); }},
    {"pipetrain_worker_message_cpu_seconds_per_byte",
     "CPU a byte of payload adds to a stage-stream message end, measured "
     "at start (WorkerInfo.message_cpu_seconds_per_byte)",
     [](const v1::WorkerInfo& i) { return i.message_cpu_seconds_per_byte(); },
     [](double v, v1::WorkerInfo* i) {
       i->set_message_cpu_seconds_per_byte(v);
     }},
    {"pipetrain_worker_stream_hop_seconds",
     "One stage-stream message's way from the sending thread to the woken "
     "receiver, measured at start (WorkerInfo.stream_hop_seconds)",
     [](const v1::WorkerInfo& i) { return i.stream_hop_seconds(); },
     [](double v, v1::WorkerInfo* i) { i->set_stream_hop_seconds(v); }},
    {"pipetrain_worker_host_cpus",
     "CPUs this worker may run on (WorkerInfo.host_cpus)",
     [](const v1::WorkerInfo& i) { return static_cast<double>(i.host_cpus()); },
     [](double v, v1::WorkerInfo* i) {
       i->set_host_cpus(static_cast<int32_t>(v));
     }},
};

}  // namespace

absl::Status ExportPlannerFigures(const v1::WorkerInfo& info,
                                  MetricsRegistry* registry) {
  for (const Figure& f : kFigures) {
    const double value = f.get(info);
    if (value == 0) continue;
    ASSIGN_OR_RETURN(Gauge * gauge, registry->GetGauge(f.name, f.help));
    gauge->Set(value);
  }
  return absl::OkStatus();
}

absl::Status ReadPlannerFigures(absl::string_view metrics_text,
                                v1::WorkerInfo* info) {
  for (absl::string_view line : absl::StrSplit(metrics_text, '\n')) {
    for (const Figure& f : kFigures) {
      absl::string_view rest = line;
      // The gauge has no labels: its name, a space, the value.
      if (!absl::ConsumePrefix(&rest, f.name) ||
          !absl::ConsumePrefix(&rest, " ")) {
        continue;
      }
      double value = 0;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(rest), &value) ||
          !std::isfinite(value) || value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.name, ": not a number >= 0: ", rest));
      }
      f.set(value, info);
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
