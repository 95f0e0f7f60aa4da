#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

static_assert(std::atomic<double>::is_always_lock_free,
              "metrics rely on lock-free atomic<double>");

// C++17 has no atomic<double>::fetch_add; a CAS loop gives the same result.
void AtomicAdd(std::atomic<double>* target, double delta) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + delta,
                                        std::memory_order_relaxed)) {
  }
}

bool IsNameChar(char c, bool allow_colon, bool allow_digit) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
    return true;
  }
  if (allow_digit && c >= '0' && c <= '9') return true;
  return allow_colon && c == ':';
}

bool MatchesNameSyntax(const std::string& name, bool allow_colon) {
  if (name.empty() || !IsNameChar(name[0], allow_colon, false)) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return IsNameChar(c, allow_colon, true); });
}

// Escaping for label values: backslash, double quote and newline.
void AppendEscapedLabelValue(const std::string& value, std::string* out) {
  for (char c : value) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '"') {
      out->append("\\\"");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

// Escaping for HELP text: backslash and newline only.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out.append("\\\\");
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Appends `name{labels} value\n`, or `name value\n` without labels.
void AppendSample(const std::string& name, const std::string& labels,
                  double value, std::string* out) {
  out->append(name);
  if (!labels.empty()) absl::StrAppend(out, "{", labels, "}");
  absl::StrAppend(out, " ", FormatMetricValue(value), "\n");
}

std::vector<std::string> RenderLeLabels(const std::vector<double>& bounds) {
  std::vector<std::string> out;
  out.reserve(bounds.size() + 1);
  for (double b : bounds) out.push_back(FormatMetricValue(b));
  out.push_back("+Inf");
  return out;
}

std::unique_ptr<std::atomic<uint64_t>[]> ZeroCounts(size_t n) {
  std::unique_ptr<std::atomic<uint64_t>[]> counts(new std::atomic<uint64_t>[n]);
  for (size_t i = 0; i < n; ++i) counts[i].store(0, std::memory_order_relaxed);
  return counts;
}

absl::Status ValidateLabelNames(const std::string& metric,
                                const std::vector<std::string>& label_names,
                                bool is_histogram) {
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", metric, ": invalid label name '", label,
                       "' (want [a-zA-Z_][a-zA-Z0-9_]*, no leading __)"));
    }
    if (is_histogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", metric, ": label name 'le' is reserved"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", metric, ": duplicate label name '", label, "'"));
    }
  }
  return absl::OkStatus();
}

// Drops a trailing +Inf (it is implicit) and checks the rest.
absl::Status NormalizeBuckets(const std::string& metric,
                              std::vector<double>* bounds) {
  if (!bounds->empty() && bounds->back() == INFINITY) bounds->pop_back();
  for (size_t i = 0; i < bounds->size(); ++i) {
    const double b = (*bounds)[i];
    if (!std::isfinite(b) || (i > 0 && b <= (*bounds)[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", metric,
                       ": bucket bounds must be finite and strictly "
                       "increasing, got [",
                       absl::StrJoin(*bounds, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

// A gauge family whose samples come from a callback at scrape time.
class CallbackGaugeFamily final : public metrics_internal::FamilyBase {
 public:
  CallbackGaugeFamily(std::string name, std::string help,
                      std::vector<std::string> label_names,
                      GaugeCallback callback)
      : FamilyBase(std::move(name), std::move(help), Gauge::kTypeName,
                   std::move(label_names)),
        callback_(std::move(callback)) {}

  bool is_callback() const override { return true; }

 private:
  void RenderSamples(std::string* out) const override {
    std::vector<GaugeSample> samples = callback_();
    std::stable_sort(samples.begin(), samples.end(),
                     [](const GaugeSample& a, const GaugeSample& b) {
                       return a.label_values < b.label_values;
                     });
    const std::vector<std::string>* previous = nullptr;
    for (const GaugeSample& sample : samples) {
      if (sample.label_values.size() != label_names().size()) {
        PT_LOG(WARNING) << "metric " << name() << ": callback sample has "
                        << sample.label_values.size() << " label values, want "
                        << label_names().size() << "; dropped";
        continue;
      }
      if (previous != nullptr && *previous == sample.label_values) continue;
      previous = &sample.label_values;
      AppendSample(name(), RenderLabels(sample.label_values), sample.value,
                   out);
    }
  }

  // Constant after construction.
  const GaugeCallback callback_;
};

}  // namespace

bool IsValidMetricName(const std::string& name) {
  return MatchesNameSyntax(name, /*allow_colon=*/true);
}

bool IsValidLabelName(const std::string& name) {
  return MatchesNameSyntax(name, /*allow_colon=*/false) &&
         name.compare(0, 2, "__") != 0;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Integral values (counts, bytes) read better as integers than in the
  // exponent form shortest round-trip picks for e.g. 200000 ("2e+05").
  if (std::trunc(value) == value && std::fabs(value) < 1e15) {
    const std::to_chars_result r =
        std::to_chars(buf, buf + sizeof(buf), static_cast<long long>(value));
    return std::string(buf, r.ptr);
  }
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  if (!(start > 0) || !(factor > 1) || count < 1) return out;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) out.push_back(bound);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> out;
  if (!(width > 0) || count < 1) return out;
  for (int i = 0; i < count; ++i) out.push_back(start + i * width);
  return out;
}

// ---------------------------------------------------------------------------
// Counter, Gauge, Histogram

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;  // negative or NaN
  AtomicAdd(&value_, delta);
}

void Counter::AppendSamples(const std::string& name, const std::string& labels,
                            std::string* out) const {
  AppendSample(name, labels, Value(), out);
}

void Gauge::Increment(double delta) { AtomicAdd(&value_, delta); }

void Gauge::AppendSamples(const std::string& name, const std::string& labels,
                          std::string* out) const {
  AppendSample(name, labels, Value(), out);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      le_labels_(RenderLeLabels(upper_bounds_)),
      bucket_counts_(ZeroCounts(upper_bounds_.size() + 1)) {}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
      upper_bounds_.begin();
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

uint64_t Histogram::Count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    total += bucket_counts_[i].load(std::memory_order_relaxed);
  }
  return total;
}

void Histogram::AppendSamples(const std::string& name,
                              const std::string& labels,
                              std::string* out) const {
  const std::string bucket_name = name + "_bucket";
  const std::string le_prefix = labels.empty() ? "le=\"" : labels + ",le=\"";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < le_labels_.size(); ++i) {
    cumulative += bucket_counts_[i].load(std::memory_order_relaxed);
    AppendSample(bucket_name, absl::StrCat(le_prefix, le_labels_[i], "\""),
                 static_cast<double>(cumulative), out);
  }
  AppendSample(name + "_sum", labels, Sum(), out);
  AppendSample(name + "_count", labels, static_cast<double>(cumulative), out);
}

// ---------------------------------------------------------------------------
// Families

namespace metrics_internal {

FamilyBase::FamilyBase(std::string name, std::string help, const char* type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

const std::vector<double>& FamilyBase::bucket_bounds() const {
  static const std::vector<double>* const kNone = new std::vector<double>();
  return *kNone;
}

void FamilyBase::Render(std::string* out) const {
  std::string samples;
  RenderSamples(&samples);
  if (samples.empty()) return;
  absl::StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n");
  absl::StrAppend(out, "# TYPE ", name_, " ", type_, "\n");
  out->append(samples);
}

std::string FamilyBase::RenderLabels(
    const std::vector<std::string>& values) const {
  std::string out;
  for (size_t i = 0; i < values.size() && i < label_names_.size(); ++i) {
    if (i > 0) out.push_back(',');
    absl::StrAppend(&out, label_names_[i], "=\"");
    AppendEscapedLabelValue(values[i], &out);
    out.push_back('"');
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> FamilyBase::ValuesFromLabels(
    const Labels& labels) const {
  std::vector<std::string> values(label_names_.size());
  std::vector<bool> filled(label_names_.size(), false);
  for (const auto& [label, value] : labels) {
    const auto it = std::find(label_names_.begin(), label_names_.end(), label);
    if (it == label_names_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name_, " has no label '", label,
                       "' (labels: ", absl::StrJoin(label_names_, ","), ")"));
    }
    const size_t index = it - label_names_.begin();
    if (filled[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name_, ": label '", label, "' given twice"));
    }
    filled[index] = true;
    values[index] = value;
  }
  if (labels.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric ", name_, " needs values for all of its labels (",
        absl::StrJoin(label_names_, ","), "), got ", labels.size()));
  }
  return values;
}

}  // namespace metrics_internal

template <typename Metric>
Family<Metric>::Family(std::string name, std::string help,
                       std::vector<std::string> label_names,
                       std::vector<double> bucket_bounds)
    : FamilyBase(std::move(name), std::move(help), Metric::kTypeName,
                 std::move(label_names)),
      bucket_bounds_(std::move(bucket_bounds)) {
  // An unlabelled metric exists from the start, so it is scraped as 0.
  if (FamilyBase::label_names().empty()) (void)WithLabelValues({});
}

template <typename Metric>
absl::StatusOr<Metric*> Family<Metric>::WithLabelValues(
    const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name(), " has ", label_names().size(),
                     " labels (", absl::StrJoin(label_names(), ","), "), got ",
                     label_values.size(), " values"));
  }
  absl::MutexLock lock(&mu_);
  auto it = children_.find(label_values);
  if (it == children_.end()) {
    std::unique_ptr<Metric> child;
    if constexpr (std::is_same_v<Metric, Histogram>) {
      child = std::make_unique<Histogram>(bucket_bounds_);
    } else {
      child = std::make_unique<Metric>();
    }
    it = children_
             .emplace(label_values, std::make_pair(RenderLabels(label_values),
                                                   std::move(child)))
             .first;
  }
  return it->second.second.get();
}

template <typename Metric>
absl::StatusOr<Metric*> Family<Metric>::WithLabels(const Labels& labels) {
  ASSIGN_OR_RETURN(std::vector<std::string> values, ValuesFromLabels(labels));
  return WithLabelValues(values);
}

template <typename Metric>
void Family<Metric>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    child.second->AppendSamples(name(), child.first, out);
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---------------------------------------------------------------------------
// MetricsRegistry

template <typename Metric>
absl::StatusOr<Family<Metric>*> MetricsRegistry::AddFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names,
    std::vector<double> bucket_bounds, bool any_label_order) {
  constexpr bool kIsHistogram = std::is_same_v<Metric, Histogram>;
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid metric name '", name, "' (want [a-zA-Z_:][a-zA-Z0-9_:]*)"));
  }
  RETURN_IF_ERROR(ValidateLabelNames(name, label_names, kIsHistogram));
  if (kIsHistogram) RETURN_IF_ERROR(NormalizeBuckets(name, &bucket_bounds));
  ASSIGN_OR_RETURN(
      metrics_internal::FamilyBase * family,
      FindOrInsert(std::make_unique<Family<Metric>>(name, help, label_names,
                                                    std::move(bucket_bounds)),
                   any_label_order));
  // FindOrInsert only returns a family of the same type that is not a
  // callback family, i.e. a Family<Metric>.
  return static_cast<Family<Metric>*>(family);
}

absl::StatusOr<metrics_internal::FamilyBase*> MetricsRegistry::FindOrInsert(
    std::unique_ptr<metrics_internal::FamilyBase> candidate,
    bool any_label_order) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = families_.try_emplace(candidate->name());
  if (inserted) {
    it->second = std::move(candidate);
    return it->second.get();
  }
  const metrics_internal::FamilyBase& existing = *it->second;
  const std::string& name = candidate->name();
  if (existing.is_callback() || candidate->is_callback() ||
      std::strcmp(existing.type(), candidate->type()) != 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "metric ", name, " is already registered as a ",
        existing.is_callback() ? "callback " : "", existing.type()));
  }
  std::vector<std::string> have = existing.label_names();
  std::vector<std::string> want = candidate->label_names();
  if (any_label_order) {
    std::sort(have.begin(), have.end());
    std::sort(want.begin(), want.end());
  }
  if (have != want) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", name, " is already registered with labels (",
                     absl::StrJoin(existing.label_names(), ","), "), not (",
                     absl::StrJoin(candidate->label_names(), ","), ")"));
  }
  if (existing.bucket_bounds() != candidate->bucket_bounds()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "histogram ", name, " is already registered with buckets [",
        absl::StrJoin(existing.bucket_bounds(), ","), "]"));
  }
  return it->second.get();
}

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounterFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names) {
  return AddFamily<Counter>(name, help, label_names, {}, false);
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGaugeFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names) {
  return AddFamily<Gauge>(name, help, label_names, {}, false);
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogramFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names,
    const std::vector<double>& bucket_bounds) {
  return AddFamily<Histogram>(name, help, label_names, bucket_bounds, false);
}

absl::Status MetricsRegistry::AddCallbackGauge(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names, GaugeCallback callback) {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid metric name '", name, "'"));
  }
  if (!callback) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name, ": empty callback"));
  }
  RETURN_IF_ERROR(ValidateLabelNames(name, label_names, false));
  return FindOrInsert(std::make_unique<CallbackGaugeFamily>(
                          name, help, label_names, std::move(callback)),
                      false)
      .status();
}

namespace {
std::vector<std::string> LabelNamesOf(const Labels& labels) {
  std::vector<std::string> names;
  names.reserve(labels.size());
  for (const auto& label : labels) names.push_back(label.first);
  return names;
}
}  // namespace

absl::StatusOr<Counter*> MetricsRegistry::GetCounter(const std::string& name,
                                                     const std::string& help,
                                                     const Labels& labels) {
  ASSIGN_OR_RETURN(CounterFamily * family,
                   AddFamily<Counter>(name, help, LabelNamesOf(labels), {},
                                      /*any_label_order=*/true));
  return family->WithLabels(labels);
}

absl::StatusOr<Gauge*> MetricsRegistry::GetGauge(const std::string& name,
                                                 const std::string& help,
                                                 const Labels& labels) {
  ASSIGN_OR_RETURN(GaugeFamily * family,
                   AddFamily<Gauge>(name, help, LabelNamesOf(labels), {},
                                    /*any_label_order=*/true));
  return family->WithLabels(labels);
}

absl::StatusOr<Histogram*> MetricsRegistry::GetHistogram(
    const std::string& name, const std::string& help,
    const std::vector<double>& bucket_bounds, const Labels& labels) {
  ASSIGN_OR_RETURN(
      HistogramFamily * family,
      AddFamily<Histogram>(name, help, LabelNamesOf(labels), bucket_bounds,
                           /*any_label_order=*/true));
  return family->WithLabels(labels);
}

std::string MetricsRegistry::RenderText() const {
  // Families are never removed, so the pointers outlive the lock; rendering
  // outside it keeps callback gauges from running under the registry lock.
  std::vector<const metrics_internal::FamilyBase*> families;
  {
    absl::MutexLock lock(&mu_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) {
      families.push_back(family.get());
    }
  }
  std::string out;
  for (const metrics_internal::FamilyBase* family : families) {
    family->Render(&out);
  }
  return out;
}

}  // namespace pipetrain
