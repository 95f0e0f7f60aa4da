// The two dynamic programs behind the placement search (planner_search.h).
// Both work on layer suffixes: a state is "layers [e, L) split into r stages,
// the first of them on worker w", its value the smallest achievable
// bottleneck. Working from the end makes r the number of stages from this
// one to the last, exactly what the 1F1B memory model needs (min(M, K - s)),
// so one pass yields the best bottleneck for every stage count K.
//
//   value(e, r, w) = min over end, next worker v allowed after w of
//       max(compute(e, end, w), transfer(end, zone w, zone v),
//           value(end, r - 1, v))
//
// Only the zone of v enters the stage's own time, so the candidates for v
// are folded into one table per (end, zone of v): O(Z) per end, not O(W).
// The end loop stops once the stage's compute alone reaches the best value
// found or the bound (compute only grows with end), or its memory overflows
// the worker (memory only grows with end too).
//
//  * SubsetDp: "allowed after w" = "in the set of workers still unused";
//    states carry that set. Exact over every ordered choice of distinct
//    workers. O(2^W * W * L * span * Z) time, O(2^W * L * (W + Z)) memory.
//  * OrderedDp: "allowed after w" = "later in a fixed worker order" (workers
//    may be skipped). O(K * W * L * span * Z) time, O(K * W * L) memory.
// span = the stage lengths an end loop visits: up to L - e, about L / r
// unbounded, a few stage lengths once a bound is known.
//
// Internal to the planner. Not thread-safe; one Run per instance.
#ifndef PIPETRAIN_SCHEDULER_PLANNER_DP_H_
#define PIPETRAIN_SCHEDULER_PLANNER_DP_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "scheduler/planner.h"
#include "scheduler/planner_cost_model.h"

namespace pipetrain {
namespace planner_internal {

// What the caller still wants from a search. A state whose best value is
// above its bound may be left +inf or inexact; values at or below are exact,
// so the best plan within plan_bound is always found.
struct SearchShape {
  int max_stages = 0;
  bool exact_count = false;  // only max_stages stages are wanted
  // [K]: a plan of K stages is of use only with a bottleneck at or below
  // this; -infinity when K stages are not wanted at all.
  std::vector<double> plan_bound;
  // [r]: max over K >= r of plan_bound[K], the bound for a suffix of r.
  std::vector<double> bound;

  // Fills `bound` from `plan_bound`.
  void DeriveSuffixBounds();
  // The largest start layer worth solving for a suffix of r stages.
  int LastBegin(int layers, int r) const {
    return exact_count && r == max_stages ? 0 : layers - r;
  }
};

struct Choice {
  int32_t end = -1;   // first layer after the stage
  int32_t next = -1;  // who holds the next stage (order position or worker)
};

class OrderedDp {
 public:
  // `model` is borrowed and must outlive this object.
  OrderedDp(const StageCostModel& model, std::vector<int> order);

  void Run(const SearchShape& shape);
  // Best bottleneck with exactly k stages; +inf when none within the bound.
  double Bottleneck(int k) const { return best_[k].first; }
  // Its stages (layers and workers only). Requires a finite Bottleneck(k).
  std::vector<StageAssignment> Placement(int k) const;

 private:
  size_t Slot(int p, int e) const {
    return static_cast<size_t>(p) * (layers_ + 1) + e;
  }
  size_t ChoiceIndex(int r, int p, int e) const {
    return (static_cast<size_t>(r - 2) * workers_ + p) * layers_ + e;
  }
  void ComputePruningTables();
  bool Useless(int r, int p, int e) const;
  void SolveLastLevel(std::vector<double>& level) const;
  void SolveLevel(int r, const std::vector<double>& below,
                  std::vector<double>& level);
  void RecordBest(int r, const std::vector<double>& level);

  // Constant after construction.
  const StageCostModel& model_;
  const std::vector<int> order_;
  const int layers_;
  const int workers_;
  // Per Run.
  const SearchShape* shape_ = nullptr;
  std::vector<double> suffix_speed_;          // [p * (K+1) + r]: see .cc
  std::vector<double> prefix_work_;           // [r * W + p]: see .cc
  std::vector<Choice> choices_;               // [((r - 2) * W + p) * L + e]
  std::vector<std::pair<double, int>> best_;  // per k: value, first position
  std::vector<double> next_value_;  // best suffix per (x, zone), for a level
  std::vector<int32_t> next_who_;   // its first position
};

class SubsetDp {
 public:
  // `model` is borrowed and must outlive this object.
  explicit SubsetDp(const StageCostModel& model);

  void Run(const SearchShape& shape);
  double Bottleneck(int k) const { return best_[k].value; }
  std::vector<StageAssignment> Placement(int k) const;

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
  void SolveFirstWorker(uint32_t set, int r, int w);

  // Constant after construction.
  const StageCostModel& model_;
  const int layers_;
  const int workers_;
  const int zones_;
  // Per Run.
  const SearchShape* shape_ = nullptr;
  std::vector<double> value_;    // [(set * (L + 1) + x) * Z + z]
  std::vector<int32_t> who_;     // the first worker behind each value_
  std::vector<Choice> choices_;  // [(set * W + w) * L + e]
  std::vector<Best> best_;       // per stage count
};

}  // namespace planner_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLANNER_DP_H_
