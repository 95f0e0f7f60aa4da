// The process's Prometheus metrics: a thin layer over prometheus-cpp
// (Debian prometheus-cpp-dev) whose registry, metric families and text
// serializer do the work. The layer adds what the project relies on and
// prometheus-cpp lacks:
//   - no exceptions: prometheus-cpp throws std::invalid_argument on bad
//     names, labels, buckets and type clashes; arguments are validated here
//     first and every throwing call is wrapped (see metrics_registry.cc), so
//     misuse comes back as an absl::Status;
//   - one label set per metric name (prometheus-cpp lets children of one
//     family carry different label names, which breaks PromQL aggregation);
//   - gauges computed at scrape time from a callback (workers by state);
//   - a deterministic exposition: families sorted by name, children by
//     labels, help text escaped.
//
// Usage: look up the labelled child once, cache the pointer, update it on
// hot paths (prometheus-cpp's Counter, Gauge and Histogram are thread-safe
// and lock-free to update):
//
//   ASSIGN_OR_RETURN(Counter* sent,
//                    registry.GetCounter("pipetrain_stage_bytes_total",
//                                        "Bytes moved per direction.",
//                                        {{"direction", "sent"}}));
//   sent->Increment(payload.size());
//
// Naming follows Prometheus conventions (counters end in `_total`, base
// units `_seconds` / `_bytes`); the registry checks the syntax of names, not
// these conventions (promtool does, in the tests).
#ifndef PIPETRAIN_COMMON_METRICS_REGISTRY_H_
#define PIPETRAIN_COMMON_METRICS_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pipetrain {

// The metric types are prometheus-cpp's own.
using Counter = prometheus::Counter;
using Gauge = prometheus::Gauge;
using Histogram = prometheus::Histogram;

// (label name, label value) pairs, in any order.
using Labels = std::vector<std::pair<std::string, std::string>>;

// `count` histogram upper bounds start, start*factor, ... (start > 0,
// factor > 1); invalid arguments give an empty vector, which leaves only
// the implicit +Inf bucket.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// One gauge sample produced at scrape time.
struct GaugeSample {
  std::vector<std::string> label_values;  // one per label name, in order
  double value = 0.0;
};
// Computes gauge samples when the registry is rendered. Called on the
// scraping thread with no registry lock held; must be thread-safe itself and
// must not block for long.
using GaugeCallback = std::function<std::vector<GaugeSample>()>;

// Owns the metric families of a process and renders them. Thread-safe:
// every method may be called from any thread. Metrics are never removed;
// pointers returned by Get* stay valid for the registry's lifetime.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The child of metric `name` with `labels`, creating the family (with the
  // label names of `labels`) and the child on first use; `help` of the
  // first registration wins. Takes a lock: cache the pointer rather than
  // calling per event.
  // kInvalidArgument: bad metric or label name, a repeated label, "le" on a
  // histogram, bucket bounds not finite and strictly increasing.
  // kAlreadyExists: `name` is registered with another type, other label
  // names or (histograms) other bucket bounds.
  absl::StatusOr<Counter*> GetCounter(const std::string& name,
                                      const std::string& help,
                                      const Labels& labels = {});
  absl::StatusOr<Gauge*> GetGauge(const std::string& name,
                                  const std::string& help,
                                  const Labels& labels = {});
  absl::StatusOr<Histogram*> GetHistogram(
      const std::string& name, const std::string& help,
      const std::vector<double>& bucket_bounds, const Labels& labels = {});

  // Registers a gauge family whose samples `callback` computes at scrape
  // time. Samples whose label count is wrong are dropped, as are repeated
  // label values (first wins). kAlreadyExists if `name` is registered in any
  // form; kInvalidArgument as for Get*, or for an empty callback.
  absl::Status AddCallbackGauge(const std::string& name,
                                const std::string& help,
                                const std::vector<std::string>& label_names,
                                GaugeCallback callback);

  // The whole registry in the text exposition format 0.0.4: families sorted
  // by name, children sorted by labels. Families without samples are
  // omitted. The /metrics routes serve this.
  std::string RenderText() const;

 private:
  class CallbackGauge;
  // The family registered under a name: one of prometheus-cpp's (owned by
  // registry_), or monostate for a callback gauge.
  using FamilyRef =
      std::variant<std::monostate, prometheus::Family<Counter>*,
                   prometheus::Family<Gauge>*, prometheus::Family<Histogram>*>;
  // What was registered under one name.
  struct Shape {
    FamilyRef family;
    std::vector<std::string> label_names;  // sorted
    std::vector<double> bucket_bounds;     // histograms only
  };

  template <typename Metric>
  absl::StatusOr<Metric*> GetMetric(const std::string& name,
                                    const std::string& help,
                                    const std::vector<double>& bucket_bounds,
                                    const Labels& labels);
  // The family of `name`, registered in `registry_` when new; checks that an
  // existing one has the same shape.
  template <typename Metric>
  absl::StatusOr<prometheus::Family<Metric>*> FindOrAddFamily(
      const std::string& name, const std::string& help, Shape wanted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails unless `name` is free or registered with exactly `wanted`'s shape.
  absl::Status CheckShape(const std::string& name, const Shape& wanted) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction; thread-safe itself.
  const std::unique_ptr<prometheus::Registry> registry_;

  mutable absl::Mutex mu_;
  std::map<std::string, Shape> shapes_ ABSL_GUARDED_BY(mu_);
  // Shared so that RenderText can call them without holding mu_.
  std::vector<std::shared_ptr<const CallbackGauge>> callbacks_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_REGISTRY_H_
