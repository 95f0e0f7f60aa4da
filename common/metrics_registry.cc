#include "common/metrics_registry.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "prometheus/check_names.h"
#include "prometheus/detail/builder.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace pipetrain {
namespace {

// Exposition type names, in the order of MetricsRegistry::FamilyRef.
constexpr const char* kTypeNames[] = {"callback gauge", "counter", "gauge",
                                      "histogram"};

// prometheus-cpp 1.0.1 writes help text verbatim; the text format wants
// backslashes and newlines escaped there.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (const char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Everything prometheus-cpp would throw std::invalid_argument for (names,
// reserved and repeated labels) is checked here first.
absl::Status ValidateNames(const std::string& metric,
                           const std::vector<std::string>& label_names,
                           bool histogram) {
  if (!prometheus::CheckMetricName(metric)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid metric name '", metric, "' (want [a-zA-Z_:][a-zA-Z0-9_:]*)"));
  }
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!prometheus::CheckLabelName(label)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", metric, ": invalid label name '", label,
                       "' (want [a-zA-Z_][a-zA-Z0-9_]*, not starting __)"));
    }
    // prometheus-cpp accepts "le" on a histogram and renders it twice.
    if (histogram && label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", metric, ": label 'le' is reserved for buckets"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", metric, ": label '", label, "' repeated"));
    }
  }
  return absl::OkStatus();
}

// prometheus-cpp throws on unsorted bounds; a trailing +Inf is implicit.
absl::StatusOr<std::vector<double>> NormalizeBuckets(
    const std::string& metric, std::vector<double> bounds) {
  if (!bounds.empty() && bounds.back() == INFINITY) bounds.pop_back();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", metric,
                       ": bucket bounds must be finite and strictly "
                       "increasing, got [",
                       absl::StrJoin(bounds, ", "), "]"));
    }
  }
  return bounds;
}

std::vector<std::string> SortedNames(const Labels& labels) {
  std::vector<std::string> names;
  names.reserve(labels.size());
  for (const auto& label : labels) names.push_back(label.first);
  std::sort(names.begin(), names.end());
  return names;
}

// Runs a prometheus-cpp call that may throw. The arguments were validated
// first, so an exception here is a bug in this file (or bad_alloc); it
// becomes kInternal instead of escaping into a caller that cannot expect it.
template <typename Call>
auto NoThrow(const std::string& what, Call call)
    -> absl::StatusOr<decltype(call())> {
  try {
    return call();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("prometheus-cpp refused ", what, ": ", e.what()));
  }
}

}  // namespace

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  if (!(start > 0) || !(factor > 1) || count < 1) return out;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) out.push_back(bound);
  return out;
}

// A gauge family computed at scrape time; prometheus-cpp has no such
// metric. Thread-safe if the callback is (it is required to be).
class MetricsRegistry::CallbackGauge {
 public:
  CallbackGauge(std::string name, std::string help,
                std::vector<std::string> label_names, GaugeCallback callback)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        callback_(std::move(callback)) {}

  // The family as prometheus-cpp's serializer takes it.
  prometheus::MetricFamily Collect() const {
    prometheus::MetricFamily family;
    family.name = name_;
    family.help = help_;
    family.type = prometheus::MetricType::Gauge;
    std::set<std::vector<std::string>> seen;
    for (GaugeSample& sample : callback_()) {
      if (sample.label_values.size() != label_names_.size()) continue;
      if (!seen.insert(sample.label_values).second) continue;  // first wins
      prometheus::ClientMetric metric;
      for (size_t i = 0; i < label_names_.size(); ++i) {
        metric.label.push_back(
            {label_names_[i], std::move(sample.label_values[i])});
      }
      metric.gauge.value = sample.value;
      family.metric.push_back(std::move(metric));
    }
    return family;
  }

 private:
  // Constant after construction.
  const std::string name_;
  const std::string help_;  // escaped
  const std::vector<std::string> label_names_;
  const GaugeCallback callback_;
};

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_unique<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

absl::Status MetricsRegistry::CheckShape(const std::string& name,
                                         const Shape& wanted) const {
  const auto it = shapes_.find(name);
  if (it == shapes_.end()) return absl::OkStatus();
  const Shape& have = it->second;
  if (have.family.index() != wanted.family.index() ||
      wanted.family.index() == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", name, " is already registered as a ",
                     kTypeNames[have.family.index()]));
  }
  if (have.label_names != wanted.label_names) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", name, " is already registered with labels (",
                     absl::StrJoin(have.label_names, ","), "), not (",
                     absl::StrJoin(wanted.label_names, ","), ")"));
  }
  if (have.bucket_bounds != wanted.bucket_bounds) {
    return absl::AlreadyExistsError(absl::StrCat(
        "histogram ", name, " is already registered with buckets [",
        absl::StrJoin(have.bucket_bounds, ","), "]"));
  }
  return absl::OkStatus();
}

template <typename Metric>
absl::StatusOr<prometheus::Family<Metric>*> MetricsRegistry::FindOrAddFamily(
    const std::string& name, const std::string& help, Shape wanted) {
  using FamilyPtr = prometheus::Family<Metric>*;
  RETURN_IF_ERROR(CheckShape(name, wanted));
  const auto it = shapes_.find(name);
  if (it != shapes_.end()) return std::get<FamilyPtr>(it->second.family);
  // Register throws on a bad name or a name taken by another type; both
  // were ruled out above.
  ASSIGN_OR_RETURN(FamilyPtr family, NoThrow(name, [&] {
                     return &prometheus::detail::Builder<Metric>()
                                 .Name(name)
                                 .Help(EscapeHelp(help))
                                 .Register(*registry_);
                   }));
  wanted.family = family;
  shapes_.emplace(name, std::move(wanted));
  return family;
}

template <typename Metric>
absl::StatusOr<Metric*> MetricsRegistry::GetMetric(
    const std::string& name, const std::string& help,
    const std::vector<double>& bucket_bounds, const Labels& labels) {
  constexpr bool kHistogram = std::is_same_v<Metric, Histogram>;
  using FamilyPtr = prometheus::Family<Metric>*;
  Shape wanted{FamilyPtr{nullptr}, SortedNames(labels), {}};
  RETURN_IF_ERROR(ValidateNames(name, wanted.label_names, kHistogram));
  if (kHistogram) {
    ASSIGN_OR_RETURN(wanted.bucket_bounds,
                     NormalizeBuckets(name, bucket_bounds));
  }
  const std::vector<double> bounds = wanted.bucket_bounds;
  const std::map<std::string, std::string> label_map(labels.begin(),
                                                     labels.end());
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(prometheus::Family<Metric> * family,
                   FindOrAddFamily<Metric>(name, help, std::move(wanted)));
  // Add throws on bad label names and (histograms) unsorted bounds, both
  // validated above; it returns the existing child for known labels.
  return NoThrow(name, [&]() -> Metric* {
    if constexpr (kHistogram) {
      return &family->Add(label_map, bounds);
    } else {
      return &family->Add(label_map);
    }
  });
}

absl::StatusOr<Counter*> MetricsRegistry::GetCounter(const std::string& name,
                                                     const std::string& help,
                                                     const Labels& labels) {
  return GetMetric<Counter>(name, help, {}, labels);
}

absl::StatusOr<Gauge*> MetricsRegistry::GetGauge(const std::string& name,
                                                 const std::string& help,
                                                 const Labels& labels) {
  return GetMetric<Gauge>(name, help, {}, labels);
}

absl::StatusOr<Histogram*> MetricsRegistry::GetHistogram(
    const std::string& name, const std::string& help,
    const std::vector<double>& bucket_bounds, const Labels& labels) {
  return GetMetric<Histogram>(name, help, bucket_bounds, labels);
}

absl::Status MetricsRegistry::AddCallbackGauge(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names, GaugeCallback callback) {
  RETURN_IF_ERROR(ValidateNames(name, label_names, false));
  if (!callback) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name, ": empty callback"));
  }
  absl::MutexLock lock(&mu_);
  Shape shape{std::monostate{}, label_names, {}};
  std::sort(shape.label_names.begin(), shape.label_names.end());
  RETURN_IF_ERROR(CheckShape(name, shape));
  shapes_.emplace(name, std::move(shape));
  callbacks_.push_back(std::make_shared<const CallbackGauge>(
      name, EscapeHelp(help), label_names, std::move(callback)));
  return absl::OkStatus();
}

std::string MetricsRegistry::RenderText() const {
  std::vector<std::shared_ptr<const CallbackGauge>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    callbacks = callbacks_;
  }
  // Callbacks run without mu_: they take their owners' locks and may use
  // this registry.
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (const auto& callback : callbacks) {
    families.push_back(callback->Collect());
  }
  families.erase(std::remove_if(families.begin(), families.end(),
                                [](const prometheus::MetricFamily& f) {
                                  return f.metric.empty();
                                }),
                 families.end());
  // prometheus-cpp collects in registration order and keeps children in a
  // hash map; scrapes and tests read better in a stable order.
  std::sort(families.begin(), families.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (prometheus::MetricFamily& family : families) {
    std::sort(family.metric.begin(), family.metric.end(),
              [](const auto& a, const auto& b) { return a.label < b.label; });
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace pipetrain
