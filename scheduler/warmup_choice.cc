#include "scheduler/warmup_choice.h"

#include <algorithm>
#include <cmath>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/schedule.h"

namespace pipetrain {

std::string ChooseExtraWarmup(const PlanRequest& search, PlanRequest* request,
                              PipelinePlan* planned) {
  const int k = static_cast<int>(planned->stages.size());
  if (k < 2) return "extra warm-up 0 (auto: one stage, no link)\n";
  // A micro-batch's trip from a stage's forward to its backward: the
  // link's round trip, its transfers both ways and the messages' overhead.
  double rtt = 0;
  double trip = 0;
  for (int s = 0; s + 1 < k; ++s) {
    const PlannerWorker& a = request->workers[planned->stages[s].worker];
    const PlannerWorker& b = request->workers[planned->stages[s + 1].worker];
    const double round = std::max(LinkBetween(*request, a, b).rtt_seconds,
                                  LinkBetween(*request, b, a).rtt_seconds);
    rtt = std::max(rtt, round);
    trip = std::max(trip, round + 2 * planned->stages[s].transfer_seconds +
                              4 * request->message_overhead_seconds);
  }
  const double pace = planned->bottleneck_seconds;
  const int most = MaxExtraWarmup(request->micro_batches, k);
  // One more than the trip needs at the profiled pace: in bench_wan the
  // profile put the LM's stages at 10.5 ms per micro-batch where they ran
  // at 8.4, and one micro-batch short of covering the round trip leaves a
  // stall every micro-batch, where one more costs one activation of memory.
  int wanted =
      pace > 0 && trip > 0 ? static_cast<int>(std::ceil(trip / pace)) + 1 : 0;
  wanted = std::max(0, std::min(wanted, most));
  int chosen = 0;
  for (int e = wanted; e > 0; --e) {
    PlanRequest deeper = search;
    deeper.extra_warmup = e;
    deeper.num_stages = k;
    absl::StatusOr<PipelinePlan> replanned = PlanPipeline(deeper);
    if (replanned.ok()) {
      *planned = *std::move(replanned);
      chosen = e;
      break;
    }
  }
  request->extra_warmup = chosen;
  std::string why = absl::StrFormat(
      "slowest link's round trip %.3f ms (%.3f ms with transfers and message "
      "overheads) over the bottleneck's %.3f ms per micro-batch, plus one; "
      "at most %d with M = %d on %d stages",
      rtt * 1e3, trip * 1e3, pace * 1e3, std::max(0, most),
      request->micro_batches, k);
  if (chosen < wanted) {
    absl::StrAppend(&why, "; ", wanted, " would not fit the memory");
  }
  return absl::StrFormat("extra warm-up %d (auto: %s)\n", chosen, why);
}

}  // namespace pipetrain
