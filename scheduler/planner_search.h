// The placement search behind PlanPipeline: the dynamic programs of
// planner_dp.h, exact over every ordered choice of distinct workers for small
// clusters, the best over a few heuristic worker orders for large ones.
// Internal to the planner; pure functions, safe from any thread.
#ifndef PIPETRAIN_SCHEDULER_PLANNER_SEARCH_H_
#define PIPETRAIN_SCHEDULER_PLANNER_SEARCH_H_

#include <cstdint>
#include <vector>

#include "scheduler/planner.h"
#include "scheduler/planner_cost_model.h"

namespace pipetrain {
namespace planner_internal {

// Up to this many workers the search covers every ordered subset of workers
// (exact); beyond it, the best over a few heuristic worker orders.
inline constexpr int kExactSearchMaxWorkers = 7;

// Search tables hold at most this many entries (8 bytes each).
inline constexpr int64_t kMaxSearchTableEntries = int64_t{1} << 26;

// Entries the search tables need for this shape; callers refuse requests
// above kMaxSearchTableEntries instead of allocating them.
int64_t SearchTableEntries(int num_layers, int num_workers, int max_stages);

// The best placement with exactly `num_stages` stages (minimal bottleneck),
// or with num_stages == 0 any count in [1, min(#layers, #workers)] minimizing
// (M + K - 1) * bottleneck, ties to fewer stages. Stages carry only
// layer_begin, layer_end and worker. Empty when nothing fits in memory.
std::vector<StageAssignment> SearchPlacement(const StageCostModel& model,
                                             int num_stages);

}  // namespace planner_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_PLANNER_SEARCH_H_
