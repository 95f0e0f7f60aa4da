#include "services/scheduler/control_call_metrics.h"

namespace pipetrain {

void ControlCallMetrics::Record(const std::string& method,
                                const char* transport, double seconds,
                                const absl::Status& status) {
  if (registry_ == nullptr) return;
  auto h = registry_->GetHistogram(
      "pipetrain_scheduler_control_call_seconds",
      "Latency of scheduler control calls.", ExponentialBuckets(0.0001, 4, 10),
      {{"method", method}, {"transport", transport}});
  if (h.ok()) (*h)->Observe(seconds);
  if (!status.ok()) {
    auto c = registry_->GetCounter(
        "pipetrain_scheduler_control_call_errors_total",
        "Scheduler control calls that returned an error.",
        {{"method", method},
         {"transport", transport},
         {"code", absl::StatusCodeToString(status.code())}});
    if (c.ok()) (*c)->Increment();
  }
}

}  // namespace pipetrain
