// Latency and error counts of the scheduler's control calls, by method and
// transport (grpc or rest), in the process's MetricsRegistry.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_CONTROL_CALL_METRICS_H_
#define PIPETRAIN_SERVICES_SCHEDULER_CONTROL_CALL_METRICS_H_

#include <string>

#include "absl/status/status.h"
#include "common/metrics_registry.h"

namespace pipetrain {

// Latency and errors of control calls, by method and transport.
// Thread-safe.
class ControlCallMetrics {
 public:
  explicit ControlCallMetrics(MetricsRegistry* registry)
      : registry_(registry) {}
  void Record(const std::string& method, const char* transport, double seconds,
              const absl::Status& status);

 private:
  MetricsRegistry* const registry_;  // borrowed, may be null
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_CONTROL_CALL_METRICS_H_
