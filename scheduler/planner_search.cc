// Placement search. Both searches work on layer suffixes: a state is "layers
// [e, L) split into r stages, the first of them on worker w", and its value
// the smallest achievable bottleneck. Working from the end means r is the
// number of stages from this one to the last, which is exactly what the 1F1B
// memory model needs (min(M, K - s)), so one pass yields every stage count.
//
//   value(e, r, w) = min over end, next worker v allowed after w of
//       max(compute(e, end, w) + transfer(end, zone w, zone v),
//           value(end, r - 1, v))
//
// Only the zone of v enters the stage's own time, so the candidates for v are
// folded into one table per (end, zone of v): O(zones) per end, not O(W).
// The end loop stops as soon as the stage's compute alone reaches the best
// value found (it only grows with end), or its memory overflows the worker
// (memory also only grows with end), or the compute exceeds a caller bound.
//
//  * SubsetDp (<= kExactSearchMaxWorkers workers): "allowed after w" means
//    "in the set of workers still unused", so states carry that set. Exact
//    over every ordered choice of distinct workers. O(2^W * W * L * span * Z)
//    time, O(2^W * L * (W + Z)) memory.
//  * OrderedDp (more workers): "allowed after w" means "later in a fixed
//    order"; run for a few heuristic orders, best kept. O(K * W * L * span *
//    Z) time per order, O(K * W * L) memory.
// span is the stage lengths the end loop visits: about L / r without a
// bound, fewer with one; L in the worst case.
#include "scheduler/planner_search.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <numeric>
#include <utility>

namespace pipetrain {
namespace planner_internal {
namespace {
long long g_iters = 0, g_states = 0;
struct Reporter { ~Reporter() { fprintf(stderr, "iters %lld states %lld\n", g_iters, g_states); } } g_rep;
struct Choice {
  int32_t end = -1;   // first layer after the stage
  int32_t next = -1;  // who holds the next stage (order position or worker)
};

struct StageResult {
  double value = kInfinity;
  Choice choice;
};

// Best suffix values keyed by (start layer x, zone z of its first worker):
// value[x * zones + z], and who[] the first worker (or order position).
struct SuffixView {
  const double* value;
  const int32_t* who;
};

// The best first stage for layers [begin, L) on `worker` when `stages - 1`
// further stages, as tabulated in `next`, follow it.
StageResult BestFirstStage(const StageCostModel& model, int begin, int worker,
                           int stages, SuffixView next, double bound) {
  const int last_end = model.num_layers() - (stages - 1);
  const int zones = model.num_zones();
  const int from = model.zone(worker);
  const double capacity = model.MemoryCapacity(worker);
  StageResult best;
  ++g_states;
  for (int end = begin + 1; end <= last_end; ++end) {
    ++g_iters;
    const double compute = model.ComputeSeconds(begin, end, worker);
    if (compute >= best.value || compute > bound) break;
    if (model.MemoryBytes(begin, end, stages) > capacity) break;
    const double* rest = next.value + static_cast<size_t>(end) * zones;
    for (int z = 0; z < zones; ++z) {
      if (!(rest[z] < best.value)) continue;
      const double value =
          std::max(compute + model.TransferSeconds(end, from, z), rest[z]);
      if (value < best.value) {
        best = {value, {end, next.who[static_cast<size_t>(end) * zones + z]}};
      }
    }
  }
  return best;
}

// Layers [begin, L) as the last stage on `worker`, or +inf.
double LastStage(const StageCostModel& model, int begin, int worker,
                 double bound) {
  const int layers = model.num_layers();
  const double compute = model.ComputeSeconds(begin, layers, worker);
  if (compute > bound) return kInfinity;
  if (model.MemoryBytes(begin, layers, 1) > model.MemoryCapacity(worker)) {
    return kInfinity;
  }
  return compute;
}

// Lowers value[slot]/who[slot] to (value, who) when that is smaller.
void Fold(std::vector<double>& values, std::vector<int32_t>& whos, size_t slot,
          double value, int32_t who) {
  if (value < values[slot]) {
    values[slot] = value;
    whos[slot] = who;
  }
}

// Limits shared by both searches. `bound[r]`: a suffix of r stages whose
// best value exceeds it is of no use to the caller, so the search may leave
// it +inf or inexact (values at or below it are exact).
struct SearchShape {
  int max_stages = 0;
  bool exact_count = false;  // only max_stages stages are wanted
  std::vector<double> bound;
  // The largest start layer worth solving for a suffix of r stages.
  int LastBegin(int layers, int r) const {
    return exact_count && r == max_stages ? 0 : layers - r;
  }
};

// Placements whose stages go to workers increasing along `order` (workers
// may be skipped). Not thread-safe; one Run per instance.
class OrderedDp {
 public:
  OrderedDp(const StageCostModel& model, std::vector<int> order)
      : model_(model),
        order_(std::move(order)),
        layers_(model.num_layers()),
        workers_(static_cast<int>(order_.size())) {}

  void Run(const SearchShape& shape) {
    shape_ = &shape;
    ComputeFastestSums();
    best_.assign(shape.max_stages + 1, {kInfinity, -1});
    choices_.assign(static_cast<size_t>(std::max(shape.max_stages - 1, 0)) *
                        workers_ * layers_,
                    Choice{});
    std::vector<double> below, level;
    SolveLastLevel(below);
    RecordBest(1, below);
    for (int r = 2; r <= shape.max_stages; ++r) {
      SolveLevel(r, below, level);
      RecordBest(r, level);
      std::swap(below, level);
    }
  }

  double Bottleneck(int k) const { return best_[k].first; }

  std::vector<StageAssignment> Placement(int k) const {
    std::vector<StageAssignment> stages;
    int p = best_[k].second;
    int begin = 0;
    for (int r = k; r >= 2; --r) {
      const Choice& choice = choices_[ChoiceIndex(r, p, begin)];
      stages.push_back(Stage(begin, choice.end, order_[p]));
      begin = choice.end;
      p = choice.next;
    }
    stages.push_back(Stage(begin, layers_, order_[p]));
    return stages;
  }

 private:
  static StageAssignment Stage(int begin, int end, int worker) {
    StageAssignment stage;
    stage.layer_begin = begin;
    stage.layer_end = end;
    stage.worker = worker;
    return stage;
  }

  size_t Slot(int p, int e) const {
    return static_cast<size_t>(p) * (layers_ + 1) + e;
  }
  size_t ChoiceIndex(int r, int p, int e) const {
    return (static_cast<size_t>(r - 2) * workers_ + p) * layers_ + e;
  }

  // fastest_sum_[p * (K + 1) + r]: the r largest speeds at positions >= p.
  void ComputeFastestSums() {
    const int k = shape_->max_stages;
    fastest_sum_.assign(static_cast<size_t>(workers_) * (k + 1), 0.0);
    std::vector<double> speeds;
    for (int p = workers_ - 1; p >= 0; --p) {
      speeds.insert(std::upper_bound(speeds.begin(), speeds.end(),
                                     model_.speed(order_[p]), std::greater<>()),
                    model_.speed(order_[p]));
      for (int r = 1; r <= k && r <= static_cast<int>(speeds.size()); ++r) {
        fastest_sum_[p * (k + 1) + r] =
            fastest_sum_[p * (k + 1) + r - 1] + speeds[r - 1];
      }
    }
  }

  // Whether even a perfectly balanced split of [e, L) over the r fastest
  // workers from position p on would exceed the bound (any stage's compute
  // is at least the suffix's work over the sum of speeds). The margin keeps
  // rounding from discarding a state that sits exactly on the bound.
  bool CannotMeetBound(int r, int p, int e) const {
    const double speeds = fastest_sum_[p * (shape_->max_stages + 1) + r];
    return model_.ReferenceSeconds(e, layers_) / speeds >
           shape_->bound[r] * (1.0 + 1e-9);
  }

  void SolveLastLevel(std::vector<double>& level) const {
    level.assign(static_cast<size_t>(workers_) * (layers_ + 1), kInfinity);
    const int last_begin = shape_->LastBegin(layers_, 1);
    for (int p = 0; p < workers_; ++p) {
      for (int e = 0; e <= last_begin; ++e) {
        level[Slot(p, e)] = LastStage(model_, e, order_[p], shape_->bound[1]);
      }
    }
  }

  // Level r from level r - 1; position p may be followed by any later one,
  // so walk p downwards and fold each position into `next` after using it.
  void SolveLevel(int r, const std::vector<double>& below,
                  std::vector<double>& level) {
    const int zones = model_.num_zones();
    next_value_.assign(static_cast<size_t>(layers_ + 1) * zones, kInfinity);
    next_who_.assign(next_value_.size(), -1);
    level.assign(below.size(), kInfinity);
    const int last_begin = shape_->LastBegin(layers_, r);
    const SuffixView next{next_value_.data(), next_who_.data()};
    for (int p = workers_ - 1; p >= 0; --p) {
      const int worker = order_[p];
      for (int e = 0; p + r <= workers_ && e <= last_begin; ++e) {
        if (CannotMeetBound(r, p, e)) continue;
        const StageResult best =
            BestFirstStage(model_, e, worker, r, next, shape_->bound[r]);
        level[Slot(p, e)] = best.value;
        choices_[ChoiceIndex(r, p, e)] = best.choice;
      }
      const int z = model_.zone(worker);
      for (int x = 0; x <= layers_; ++x) {
        Fold(next_value_, next_who_, static_cast<size_t>(x) * zones + z,
             below[Slot(p, x)], p);
      }
    }
  }

  void RecordBest(int r, const std::vector<double>& level) {
    for (int p = 0; p < workers_; ++p) {
      if (level[Slot(p, 0)] < best_[r].first) best_[r] = {level[Slot(p, 0)], p};
    }
  }

  const StageCostModel& model_;
  const std::vector<int> order_;
  const int layers_;
  const int workers_;
  const SearchShape* shape_ = nullptr;
  std::vector<Choice> choices_;  // [(r - 2) * W + p) * L + e]
  std::vector<std::pair<double, int>> best_;  // per k: value, first position
  std::vector<double> fastest_sum_;           // see ComputeFastestSums
  std::vector<double> next_value_;            // SuffixView storage
  std::vector<int32_t> next_who_;
};

// Placements on any ordered choice of distinct workers: states carry the
// set of workers holding the suffix. Not thread-safe; one Run per instance.
class SubsetDp {
 public:
  explicit SubsetDp(const StageCostModel& model)
      : model_(model),
        layers_(model.num_layers()),
        workers_(model.num_workers()),
        zones_(model.num_zones()) {}

  void Run(const SearchShape& shape) {
    shape_ = &shape;
    const size_t sets = size_t{1} << workers_;
    value_.assign(sets * (layers_ + 1) * zones_, kInfinity);
    who_.assign(value_.size(), -1);
    choices_.assign(sets * workers_ * layers_, Choice{});
    best_.assign(shape.max_stages + 1, Best{});
    // A set's proper subsets are numerically smaller: solved before it.
    for (uint32_t set = 1; set < sets; ++set) {
      const int r = __builtin_popcount(set);
      if (r > shape.max_stages || r > layers_) continue;
      for (int w = 0; w < workers_; ++w) {
        if (set & (1u << w)) SolveFirstWorker(set, r, w);
      }
    }
  }

  double Bottleneck(int k) const { return best_[k].value; }

  std::vector<StageAssignment> Placement(int k) const {
    std::vector<StageAssignment> stages;
    uint32_t set = best_[k].set;
    int w = best_[k].worker;
    int begin = 0;
    while (true) {
      StageAssignment stage;
      stage.layer_begin = begin;
      stage.worker = w;
      if (set == (1u << w)) {
        stage.layer_end = layers_;
        stages.push_back(stage);
        return stages;
      }
      const Choice& choice = choices_[ChoiceIndex(set, w, begin)];
      stage.layer_end = choice.end;
      stages.push_back(stage);
      set &= ~(1u << w);
      begin = choice.end;
      w = choice.next;
    }
  }

 private:
  struct Best {
    double value = kInfinity;
    uint32_t set = 0;
    int worker = -1;
  };

  size_t Slot(uint32_t set, int x, int z) const {
    return (static_cast<size_t>(set) * (layers_ + 1) + x) * zones_ + z;
  }
  size_t ChoiceIndex(uint32_t set, int w, int e) const {
    return (static_cast<size_t>(set) * workers_ + w) * layers_ + e;
  }

  // Suffixes held by exactly the workers in `set`, the first stage on `w`.
  void SolveFirstWorker(uint32_t set, int r, int w) {
    const uint32_t rest = set & ~(1u << w);
    const SuffixView next{value_.data() + Slot(rest, 0, 0),
                          who_.data() + Slot(rest, 0, 0)};
    const double bound = shape_->bound[r];
    const int last_begin = shape_->LastBegin(layers_, r);
    for (int e = 0; e <= last_begin; ++e) {
      double value;
      if (r == 1) {
        value = LastStage(model_, e, w, bound);
      } else {
        const StageResult best = BestFirstStage(model_, e, w, r, next, bound);
        value = best.value;
        choices_[ChoiceIndex(set, w, e)] = best.choice;
      }
      Fold(value_, who_, Slot(set, e, model_.zone(w)), value, w);
      if (e == 0 && value < best_[r].value) best_[r] = {value, set, w};
    }
  }

  const StageCostModel& model_;
  const int layers_;
  const int workers_;
  const int zones_;
  const SearchShape* shape_ = nullptr;
  std::vector<double> value_;    // [(set * (L + 1) + x) * Z + z]
  std::vector<int32_t> who_;     // worker behind each value_
  std::vector<Choice> choices_;  // [(set * W + w) * L + e]
  std::vector<Best> best_;       // per stage count
};

// The zone sequence whose consecutive links are fastest: smallest worst
// link, then smallest sum (seconds per byte). Exhaustive up to 7 zones,
// greedy nearest neighbour beyond.
std::vector<int> ZoneChain(const StageCostModel& model) {
  const int zones = model.num_zones();
  std::vector<int> chain(zones);
  std::iota(chain.begin(), chain.end(), 0);
  auto cost = [&](const std::vector<int>& c) {
    std::pair<double, double> worst_and_sum{0.0, 0.0};
    for (size_t i = 0; i + 1 < c.size(); ++i) {
      const double link = model.TransferSecondsPerByte(c[i], c[i + 1]);
      worst_and_sum.first = std::max(worst_and_sum.first, link);
      worst_and_sum.second += link;
    }
    return worst_and_sum;
  };
  if (zones <= 7) {
    std::vector<int> best = chain;
    while (std::next_permutation(chain.begin(), chain.end())) {
      if (cost(chain) < cost(best)) best = chain;
    }
    return best;
  }
  for (int i = 1; i < zones; ++i) {
    auto nearest = std::min_element(
        chain.begin() + i, chain.end(), [&](int a, int b) {
          return model.TransferSecondsPerByte(chain[i - 1], a) <
                 model.TransferSecondsPerByte(chain[i - 1], b);
        });
    std::iter_swap(chain.begin() + i, nearest);
  }
  return chain;
}

// Heuristic worker orders for large clusters: as given; fastest first; and
// grouped by zone along ZoneChain so a placement crosses each slow link at
// most once, fastest (then largest) first within a zone.
std::vector<std::vector<int>> CandidateOrders(const StageCostModel& model) {
  const int workers = model.num_workers();
  std::vector<int> given(workers);
  std::iota(given.begin(), given.end(), 0);
  auto faster = [&](int a, int b) {
    if (model.speed(a) != model.speed(b)) return model.speed(a) > model.speed(b);
    return model.MemoryCapacity(a) > model.MemoryCapacity(b);
  };
  std::vector<int> by_speed = given;
  std::stable_sort(by_speed.begin(), by_speed.end(), faster);
  std::vector<int> rank(model.num_zones());
  const std::vector<int> chain = ZoneChain(model);
  for (size_t i = 0; i < chain.size(); ++i) rank[chain[i]] = i;
  std::vector<int> by_zone = given;
  std::stable_sort(by_zone.begin(), by_zone.end(), [&](int a, int b) {
    const int za = rank[model.zone(a)], zb = rank[model.zone(b)];
    return za != zb ? za < zb : faster(a, b);
  });
  // Zone grouping usually wins; trying it first tightens the later bounds.
  std::vector<std::vector<int>> orders = {by_zone};
  for (auto* order : {&given, &by_speed}) {
    if (std::find(orders.begin(), orders.end(), *order) == orders.end()) {
      orders.push_back(std::move(*order));
    }
  }
  return orders;
}

// The best placement over several searches; each search's bounds come from
// the best so far, so later searches skip what cannot win.
class BestPlacement {
 public:
  BestPlacement(int num_stages, int max_stages, int micro_batches)
      : num_stages_(num_stages), micro_batches_(micro_batches) {
    shape_.max_stages = max_stages;
    shape_.exact_count = num_stages > 0;
  }

  // Bounds for the next search: a suffix of r stages can only help a plan
  // of K >= r stages, whose bottleneck must stay under best_step/(M+K-1).
  const SearchShape& Shape() {
    shape_.bound.assign(shape_.max_stages + 1, kInfinity);
    for (int r = 1; r <= shape_.max_stages; ++r) {
      shape_.bound[r] = num_stages_ > 0
                            ? bottleneck_
                            : step_ / (micro_batches_ + r - 1.0);
    }
    return shape_;
  }

  template <typename Dp>
  void Consider(const Dp& dp) {
    const int first = num_stages_ > 0 ? num_stages_ : 1;
    for (int k = first; k <= shape_.max_stages; ++k) {
      const double bottleneck = dp.Bottleneck(k);
      if (bottleneck == kInfinity || !Improves(bottleneck, k)) continue;
      bottleneck_ = bottleneck;
      step_ = (micro_batches_ + k - 1.0) * bottleneck;
      stages_ = dp.Placement(k);
    }
  }

  std::vector<StageAssignment> Take() { return std::move(stages_); }

 private:
  bool Improves(double bottleneck, int k) const {
    if (num_stages_ > 0) return bottleneck < bottleneck_;
    const double step = (micro_batches_ + k - 1.0) * bottleneck;
    return step < step_ ||
           (step == step_ && k < static_cast<int>(stages_.size()));
  }

  const int num_stages_;
  const int micro_batches_;
  SearchShape shape_;
  double bottleneck_ = kInfinity;
  double step_ = kInfinity;
  std::vector<StageAssignment> stages_;
};

}  // namespace

int64_t SearchTableEntries(int num_layers, int num_workers, int max_stages) {
  const int64_t layers = num_layers + 1;
  if (num_workers <= kExactSearchMaxWorkers) {
    // choices + values + holders, zones <= workers
    return (int64_t{1} << num_workers) * layers * num_workers * 3;
  }
  return int64_t{max_stages} * num_workers * layers;
}

std::vector<StageAssignment> SearchPlacement(const StageCostModel& model,
                                             int num_stages) {
  const int max_stages = num_stages > 0
                             ? num_stages
                             : std::min(model.num_layers(), model.num_workers());
  BestPlacement best(num_stages, max_stages, model.micro_batches());
  if (model.num_workers() <= kExactSearchMaxWorkers) {
    SubsetDp dp(model);
    dp.Run(best.Shape());
    best.Consider(dp);
    return best.Take();
  }
  for (std::vector<int>& order : CandidateOrders(model)) {
    OrderedDp dp(model, std::move(order));
    dp.Run(best.Shape());
    best.Consider(dp);
  }
  return best.Take();
}

}  // namespace planner_internal
}  // namespace pipetrain
