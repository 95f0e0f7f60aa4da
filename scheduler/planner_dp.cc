#include "scheduler/planner_dp.h"

#include <algorithm>
#include <cstddef>
#include <functional>

namespace pipetrain {
namespace planner_internal {
namespace {

// Rounding must not discard a state that sits exactly on a bound.
constexpr double kBoundSlack = 1.0 + 1e-9;

struct StageResult {
  double value = kInfinity;
  Choice choice;
};

// Best suffix values keyed by (start layer x, zone z of its first worker):
// value[x * zones + z], and who[] that first worker (or order position).
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
  for (int end = begin + 1; end <= last_end; ++end) {
    const double compute = model.ComputeSeconds(begin, end, worker);
    if (compute >= best.value || compute > bound) break;
    if (model.MemoryBytes(begin, end, stages) > capacity) break;
    const size_t row = static_cast<size_t>(end) * zones;
    for (int z = 0; z < zones; ++z) {
      const double rest = next.value[row + z];
      if (!(rest < best.value)) continue;
      const double value =
          std::max({compute, model.TransferSeconds(end, from, z), rest});
      if (value < best.value) best = {value, {end, next.who[row + z]}};
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

// Lowers values[slot] to `value` (and whos[slot] to `who`) when smaller.
void Fold(std::vector<double>& values, std::vector<int32_t>& whos, size_t slot,
          double value, int32_t who) {
  if (value < values[slot]) {
    values[slot] = value;
    whos[slot] = who;
  }
}

StageAssignment Stage(int begin, int end, int worker) {
  StageAssignment stage;
  stage.layer_begin = begin;
  stage.layer_end = end;
  stage.worker = worker;
  return stage;
}

// sums[p * (k + 1) + q] = the q largest of speeds[0..p) (p = 0..n), or 0
// where fewer than q exist.
std::vector<double> FastestSums(const std::vector<double>& speeds, int k) {
  const int n = static_cast<int>(speeds.size());
  std::vector<double> sums(static_cast<size_t>(n + 1) * (k + 1), 0.0);
  std::vector<double> sorted;  // descending
  for (int p = 1; p <= n; ++p) {
    const double s = speeds[p - 1];
    sorted.insert(
        std::upper_bound(sorted.begin(), sorted.end(), s, std::greater<>()), s);
    const int top = std::min<int>(k, sorted.size());
    for (int q = 1; q <= top; ++q) {
      sums[p * (k + 1) + q] = sums[p * (k + 1) + q - 1] + sorted[q - 1];
    }
  }
  return sums;
}

}  // namespace

void SearchShape::DeriveSuffixBounds() {
  bound.assign(max_stages + 1, -kInfinity);
  for (int r = max_stages; r >= 1; --r) {
    bound[r] =
        std::max(plan_bound[r], r < max_stages ? bound[r + 1] : -kInfinity);
  }
}

OrderedDp::OrderedDp(const StageCostModel& model, std::vector<int> order)
    : model_(model),
      order_(std::move(order)),
      layers_(model.num_layers()),
      workers_(static_cast<int>(order_.size())) {}

void OrderedDp::Run(const SearchShape& shape) {
  shape_ = &shape;
  ComputePruningTables();
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

std::vector<StageAssignment> OrderedDp::Placement(int k) const {
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

// Two bounds skip states no plan within the bounds can use. A stage's
// compute is at least its reference work over its worker's speed, so
//  * suffix_speed_: the r fastest speeds from position p on; a suffix whose
//    work over that sum exceeds bound[r] has no stage arrangement within it;
//  * prefix_work_: the most work layers [0, e) can carry as q = K - r stages
//    on positions before p, over every wanted K: max_q (q fastest speeds
//    before p) * plan_bound[r + q].
void OrderedDp::ComputePruningTables() {
  const int k = shape_->max_stages;
  std::vector<double> speeds(workers_);
  for (int p = 0; p < workers_; ++p) speeds[p] = model_.speed(order_[p]);
  const std::vector<double> before = FastestSums(speeds, k);
  std::reverse(speeds.begin(), speeds.end());
  const std::vector<double> after = FastestSums(speeds, k);
  suffix_speed_.assign(static_cast<size_t>(workers_) * (k + 1), 0.0);
  prefix_work_.assign(static_cast<size_t>(k + 1) * workers_, -kInfinity);
  for (int p = 0; p < workers_; ++p) {
    for (int r = 1; r <= k; ++r) {
      suffix_speed_[p * (k + 1) + r] = after[(workers_ - p) * (k + 1) + r];
      double& work = prefix_work_[r * workers_ + p];
      for (int q = 1; q <= std::min(p, k - r); ++q) {
        work =
            std::max(work, before[p * (k + 1) + q] * shape_->plan_bound[r + q]);
      }
    }
  }
}

bool OrderedDp::Useless(int r, int p, int e) const {
  if (e == 0) return shape_->plan_bound[r] == -kInfinity;
  const int k = shape_->max_stages;
  const double speed = suffix_speed_[p * (k + 1) + r];
  if (speed == 0.0) return true;  // fewer than r workers left
  if (model_.ReferenceSeconds(e, layers_) / speed >
      shape_->bound[r] * kBoundSlack) {
    return true;
  }
  return model_.ReferenceSeconds(0, e) >
         prefix_work_[r * workers_ + p] * kBoundSlack;
}

void OrderedDp::SolveLastLevel(std::vector<double>& level) const {
  level.assign(static_cast<size_t>(workers_) * (layers_ + 1), kInfinity);
  const int last_begin = shape_->LastBegin(layers_, 1);
  for (int p = 0; p < workers_; ++p) {
    for (int e = 0; e <= last_begin; ++e) {
      if (Useless(1, p, e)) continue;
      level[Slot(p, e)] = LastStage(model_, e, order_[p], shape_->bound[1]);
    }
  }
}

// Level r from level r - 1. Position p may be followed by any later one, so
// walk p downwards and fold each position into the next-table after use.
void OrderedDp::SolveLevel(int r, const std::vector<double>& below,
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
      if (Useless(r, p, e)) continue;
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

void OrderedDp::RecordBest(int r, const std::vector<double>& level) {
  for (int p = 0; p < workers_; ++p) {
    if (level[Slot(p, 0)] < best_[r].first) best_[r] = {level[Slot(p, 0)], p};
  }
}

SubsetDp::SubsetDp(const StageCostModel& model)
    : model_(model),
      layers_(model.num_layers()),
      workers_(model.num_workers()),
      zones_(model.num_zones()) {}

void SubsetDp::Run(const SearchShape& shape) {
  shape_ = &shape;
  const size_t sets = size_t{1} << workers_;
  value_.assign(sets * (layers_ + 1) * zones_, kInfinity);
  who_.assign(value_.size(), -1);
  choices_.assign(sets * workers_ * layers_, Choice{});
  best_.assign(shape.max_stages + 1, Best{});
  // A set's proper subsets are numerically smaller, so solved before it.
  for (uint32_t set = 1; set < sets; ++set) {
    const int r = __builtin_popcount(set);
    if (r > shape.max_stages || r > layers_) continue;
    for (int w = 0; w < workers_; ++w) {
      if (set & (1u << w)) SolveFirstWorker(set, r, w);
    }
  }
}

std::vector<StageAssignment> SubsetDp::Placement(int k) const {
  std::vector<StageAssignment> stages;
  uint32_t set = best_[k].set;
  int w = best_[k].worker;
  int begin = 0;
  while (set != (1u << w)) {
    const Choice& choice = choices_[ChoiceIndex(set, w, begin)];
    stages.push_back(Stage(begin, choice.end, w));
    set &= ~(1u << w);
    begin = choice.end;
    w = choice.next;
  }
  stages.push_back(Stage(begin, layers_, w));
  return stages;
}

// Suffixes held by exactly the workers in `set`, the first stage on `w`.
void SubsetDp::SolveFirstWorker(uint32_t set, int r, int w) {
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

}  // namespace planner_internal
}  // namespace pipetrain
