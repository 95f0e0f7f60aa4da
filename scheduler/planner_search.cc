// Placement search driver: which dynamic program to run, over which worker
// orders, and how to keep the best plan (planner_dp.h has the programs).
#include "scheduler/planner_search.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "scheduler/planner_dp.h"

namespace pipetrain {
namespace planner_internal {
namespace {

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
    auto nearest =
        std::min_element(chain.begin() + i, chain.end(), [&](int a, int b) {
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
    if (model.speed(a) != model.speed(b)) {
      return model.speed(a) > model.speed(b);
    }
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

// Cuts the layers over the first k workers of `order` so that each one's
// share of the work is proportional to its speed (transfers ignored).
std::vector<StageAssignment> ProportionalSplit(const StageCostModel& model,
                                               const std::vector<int>& order,
                                               int k) {
  const int layers = model.num_layers();
  double speed_sum = 0.0;
  for (int i = 0; i < k; ++i) speed_sum += model.speed(order[i]);
  const double total = model.ReferenceSeconds(0, layers);
  std::vector<StageAssignment> stages;
  double share = 0.0;
  int begin = 0;
  for (int i = 0; i < k; ++i) {
    share += model.speed(order[i]) / speed_sum;
    // First cut whose prefix work reaches the target, kept so that every
    // stage, this one and the ones after it, has a layer.
    int lo = begin + 1, hi = layers - (k - 1 - i);
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (model.ReferenceSeconds(0, mid) < share * total) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int end = i + 1 == k ? layers : lo;
    StageAssignment stage;
    stage.layer_begin = begin;
    stage.layer_end = end;
    stage.worker = order[i];
    stages.push_back(stage);
    begin = end;
  }
  return stages;
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

  // Bounds for the next search: with a fixed count, only K = num_stages
  // and a smaller bottleneck help; otherwise a plan of K stages must keep
  // its bottleneck under best_step / (M + K - 1). The slack keeps rounding
  // from hiding an equal step with fewer stages.
  const SearchShape& Shape() {
    std::vector<double>& plan_bound = shape_.plan_bound;
    plan_bound.assign(shape_.max_stages + 1, -kInfinity);
    for (int k = 1; k <= shape_.max_stages; ++k) {
      if (num_stages_ > 0 && k != num_stages_) continue;
      plan_bound[k] =
          (num_stages_ > 0 ? bottleneck_ : step_ / (micro_batches_ + k - 1.0)) *
          (1.0 + 1e-9);
    }
    shape_.DeriveSuffixBounds();
    return shape_;
  }

  template <typename Dp>
  void Consider(const Dp& dp) {
    const int first = num_stages_ > 0 ? num_stages_ : 1;
    for (int k = first; k <= shape_.max_stages; ++k) {
      const double bottleneck = dp.Bottleneck(k);
      if (bottleneck == kInfinity || !Improves(bottleneck, k)) continue;
      Record(bottleneck, dp.Placement(k));
    }
  }

  // Proportional splits over every stage count on the first k workers of
  // `order`: cheap plans whose step bounds the first search.
  void Seed(const StageCostModel& model, const std::vector<int>& order) {
    const int first = num_stages_ > 0 ? num_stages_ : 1;
    for (int k = first; k <= shape_.max_stages; ++k) {
      std::vector<StageAssignment> stages = ProportionalSplit(model, order, k);
      double bottleneck = 0.0;
      for (size_t s = 0; s < stages.size(); ++s) {
        if (model.StageMemoryBytes(stages, s) >
            model.MemoryCapacity(stages[s].worker)) {
          bottleneck = kInfinity;
          break;
        }
        bottleneck = std::max(bottleneck, model.StageSeconds(stages, s));
      }
      if (bottleneck < kInfinity && Improves(bottleneck, k)) {
        Record(bottleneck, std::move(stages));
      }
    }
  }

  std::vector<StageAssignment> Take() { return std::move(stages_); }

 private:
  void Record(double bottleneck, std::vector<StageAssignment> stages) {
    bottleneck_ = bottleneck;
    step_ = (micro_batches_ + stages.size() - 1.0) * bottleneck;
    stages_ = std::move(stages);
  }

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
  const int max_stages =
      num_stages > 0 ? num_stages
                     : std::min(model.num_layers(), model.num_workers());
  BestPlacement best(num_stages, max_stages, model.micro_batches());
  if (model.num_workers() <= kExactSearchMaxWorkers) {
    std::vector<int> given(model.num_workers());
    std::iota(given.begin(), given.end(), 0);
    best.Seed(model, given);
    SubsetDp dp(model);
    dp.Run(best.Shape());
    best.Consider(dp);
    return best.Take();
  }
  std::vector<std::vector<int>> orders = CandidateOrders(model);
  best.Seed(model, orders.front());
  for (std::vector<int>& order : orders) {
    OrderedDp dp(model, std::move(order));
    dp.Run(best.Shape());
    best.Consider(dp);
  }
  return best.Take();
}

}  // namespace planner_internal
}  // namespace pipetrain
