// A small in-process metrics registry that renders the Prometheus text
// exposition format (version 0.0.4). It was written on the mistaken belief
// that prometheus-cpp is not packaged in Debian 12; it is
// (prometheus-cpp-dev 1.0.1), and this registry is due to be replaced by it.
//
// Usage: register families once at start-up, look up the labelled children
// you need, cache the pointers, and update them on hot paths:
//
//   ASSIGN_OR_RETURN(CounterFamily* bytes,
//                    registry.AddCounterFamily("pipetrain_stage_bytes_total",
//                                              "Bytes moved per direction.",
//                                              {"direction"}));
//   ASSIGN_OR_RETURN(Counter* sent, bytes->WithLabelValues({"sent"}));
//   sent->Increment(payload.size());  // lock-free
//
// or in one step: registry.GetCounter(name, help, {{"direction", "sent"}}).
//
// Naming follows Prometheus conventions (counters end in `_total`, base units
// `_seconds` / `_bytes`); the registry checks the syntax of names, not these
// conventions. Nothing here throws or aborts: misuse is reported as a Status.
#ifndef PIPETRAIN_COMMON_METRICS_H_
#define PIPETRAIN_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain {

template <typename Metric>
class Family;

// (label name, label value) pairs; order is irrelevant where a family's
// label names are already fixed.
using Labels = std::vector<std::pair<std::string, std::string>>;

// True when `name` is a valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool IsValidMetricName(const std::string& name);
// True when `name` is a valid label name: [a-zA-Z_][a-zA-Z0-9_]* and does not
// start with the reserved prefix "__".
bool IsValidLabelName(const std::string& name);

// Formats a sample value the way the exposition format expects: shortest
// round-trip decimal, "+Inf", "-Inf" or "NaN".
std::string FormatMetricValue(double value);

// Histogram bucket helpers. `count` upper bounds start, start*factor, ...
// (start > 0, factor > 1) or start, start+width, ... (width > 0); invalid
// arguments give an empty vector, which leaves only the implicit +Inf bucket.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);

// A monotonically increasing value. Thread-safe and lock-free.
class Counter {
 public:
  static constexpr const char* kTypeName = "counter";

  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta`. Negative and NaN deltas are ignored: a counter never
  // decreases.
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  template <typename>
  friend class Family;
  // Appends the sample line(s); `labels` is the rendered label list without
  // braces (may be empty).
  void AppendSamples(const std::string& name, const std::string& labels,
                     std::string* out) const;

  std::atomic<double> value_{0.0};
};

// A value that can go up and down. Thread-safe and lock-free.
class Gauge {
 public:
  static constexpr const char* kTypeName = "gauge";

  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0);
  void Decrement(double delta = 1.0) { Increment(-delta); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  template <typename>
  friend class Family;
  void AppendSamples(const std::string& name, const std::string& labels,
                     std::string* out) const;

  std::atomic<double> value_{0.0};
};

// Counts observations into fixed buckets. Thread-safe; Observe is lock-free.
// A scrape that races with Observe may see the new count before the new sum;
// `_count` always equals the `+Inf` bucket.
class Histogram {
 public:
  static constexpr const char* kTypeName = "histogram";

  // `upper_bounds` must be strictly increasing and finite (checked by the
  // registry); the +Inf bucket is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Records `value` into the first bucket whose upper bound is >= value.
  // NaN observations are ignored.
  void Observe(double value);

  uint64_t Count() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  template <typename>
  friend class Family;
  void AppendSamples(const std::string& name, const std::string& labels,
                     std::string* out) const;

  // Constant after construction.
  const std::vector<double> upper_bounds_;
  const std::vector<std::string> le_labels_;  // rendered `le` values

  // Updated lock-free. Non-cumulative counts, one per upper bound plus the
  // +Inf bucket last; the array itself is constant after construction.
  const std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;
  std::atomic<double> sum_{0.0};
};

namespace metrics_internal {

// What every family has: identity, help text and a way to render itself.
// Constant after construction except for what subclasses guard themselves.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, const char* type,
             std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const char* type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Bucket bounds for histogram families, empty otherwise.
  virtual const std::vector<double>& bucket_bounds() const;
  // True for families whose samples come from a callback.
  virtual bool is_callback() const { return false; }

  // Appends # HELP, # TYPE and all samples. Renders nothing when the family
  // has no samples.
  void Render(std::string* out) const;

 protected:
  // Appends the sample lines only.
  virtual void RenderSamples(std::string* out) const = 0;
  // Renders `values` (one per label name) as `a="x",b="y"`, escaped.
  std::string RenderLabels(const std::vector<std::string>& values) const;
  // Orders `labels` by this family's label names; fails unless `labels`
  // names exactly those labels.
  absl::StatusOr<std::vector<std::string>> ValuesFromLabels(
      const Labels& labels) const;

 private:
  const std::string name_;
  const std::string help_;
  const char* const type_;
  const std::vector<std::string> label_names_;
};

}  // namespace metrics_internal

// All children of one metric name; children differ in label values.
// Thread-safe. Children are never removed, so returned pointers stay valid
// for the lifetime of the registry that owns the family.
template <typename Metric>
class Family final : public metrics_internal::FamilyBase {
 public:
  // Returns the child with `label_values` (one per label name, in the order
  // the family was declared with), creating it on first use. Takes a lock:
  // call once and cache the pointer rather than calling per event.
  absl::StatusOr<Metric*> WithLabelValues(
      const std::vector<std::string>& label_values);
  // Same, with the labels given by name in any order.
  absl::StatusOr<Metric*> WithLabels(const Labels& labels);

  const std::vector<double>& bucket_bounds() const override {
    return bucket_bounds_;
  }

  // Use MetricsRegistry::Add*Family.
  Family(std::string name, std::string help,
         std::vector<std::string> label_names,
         std::vector<double> bucket_bounds);

 private:
  void RenderSamples(std::string* out) const override;

  // Constant after construction.
  const std::vector<double> bucket_bounds_;  // histograms only

  mutable absl::Mutex mu_;
  // Keyed by label values, so rendering order is deterministic. Each value
  // is (rendered label list, child).
  std::map<std::vector<std::string>,
           std::pair<std::string, std::unique_ptr<Metric>>>
      children_ ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// One gauge sample produced at scrape time.
struct GaugeSample {
  std::vector<std::string> label_values;  // one per label name, in order
  double value = 0.0;
};
// Computes gauge samples when the registry is rendered. Called on the
// scraping thread with no registry lock held; must be thread-safe itself and
// must not block for long.
using GaugeCallback = std::function<std::vector<GaugeSample>()>;

// Owns metric families and renders them. Thread-safe: every method may be
// called from any thread. Families are never removed; pointers returned by
// Add*/Get* stay valid for the registry's lifetime.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Creates a family, or returns the existing one when `name` is already
  // registered with the same type, label names (same order) and, for
  // histograms, bucket bounds; `help` of the first registration wins.
  // kInvalidArgument: bad metric/label name, duplicate or reserved label
  // ("le" on histograms), bad bucket bounds. kAlreadyExists: `name` is
  // registered with another type, other label names or other buckets.
  absl::StatusOr<CounterFamily*> AddCounterFamily(
      const std::string& name, const std::string& help,
      const std::vector<std::string>& label_names);
  absl::StatusOr<GaugeFamily*> AddGaugeFamily(
      const std::string& name, const std::string& help,
      const std::vector<std::string>& label_names);
  absl::StatusOr<HistogramFamily*> AddHistogramFamily(
      const std::string& name, const std::string& help,
      const std::vector<std::string>& label_names,
      const std::vector<double>& bucket_bounds);

  // Registers a gauge family whose samples `callback` computes at scrape
  // time (e.g. workers by state). Samples whose label count is wrong are
  // dropped, as are repeated label values (first wins).
  // kAlreadyExists if `name` is already registered in any form.
  absl::Status AddCallbackGauge(const std::string& name,
                                const std::string& help,
                                const std::vector<std::string>& label_names,
                                GaugeCallback callback);

  // One-step lookups: the family (created with the label names of `labels`,
  // in that order, when new) and then its child for `labels`. An existing
  // family must have exactly the names in `labels`, in any order.
  absl::StatusOr<Counter*> GetCounter(const std::string& name,
                                      const std::string& help,
                                      const Labels& labels = {});
  absl::StatusOr<Gauge*> GetGauge(const std::string& name,
                                  const std::string& help,
                                  const Labels& labels = {});
  absl::StatusOr<Histogram*> GetHistogram(
      const std::string& name, const std::string& help,
      const std::vector<double>& bucket_bounds, const Labels& labels = {});

  // The whole registry in the text exposition format 0.0.4: families sorted
  // by name, children sorted by label values. Families without samples are
  // omitted.
  std::string RenderText() const;

 private:
  // Validates the arguments, then registers a new Family<Metric> or returns
  // the matching existing one (see AddCounterFamily for the rules).
  template <typename Metric>
  absl::StatusOr<Family<Metric>*> AddFamily(
      const std::string& name, const std::string& help,
      const std::vector<std::string>& label_names,
      std::vector<double> bucket_bounds, bool any_label_order);
  // Inserts `candidate` unless its name is taken; then returns the existing
  // family if it is compatible with `candidate`, an error otherwise.
  absl::StatusOr<metrics_internal::FamilyBase*> FindOrInsert(
      std::unique_ptr<metrics_internal::FamilyBase> candidate,
      bool any_label_order);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<metrics_internal::FamilyBase>> families_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_H_
