// WeightStash: PipeDream's weight stashing. Under asynchronous updates a
// stage's weights change between a micro-batch's forward and its backward;
// the backward must use the weights the forward used. The stash keeps a
// copy of a weight version for as long as an in-flight micro-batch is
// pinned to it (and, with vertical sync, every version a later micro-batch
// may still be assigned), and swaps it in on demand. Swapping exchanges
// tensor handles: no data moves.
//
// Not thread-safe: owned by the stage's training thread.
#ifndef PIPETRAIN_WORKER_PIPELINE_WEIGHT_STASH_H_
#define PIPETRAIN_WORKER_PIPELINE_WEIGHT_STASH_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "worker/compute/backend.h"
#include "worker/nn/layer.h"

namespace pipetrain {

class WeightStash {
 public:
  // `backend` and the params are borrowed (the stage's model owns them).
  WeightStash(Backend* backend, std::vector<Param*> params)
      : backend_(backend), params_(std::move(params)) {}

  // A micro-batch's forward ran with `version`; it stays pinned until Unpin.
  void Pin(int64_t version) { ++pins_[version]; }
  void Unpin(int64_t version);
  // Vertical sync: versions >= floor stay available (later micro-batches
  // may be assigned any of them). A negative floor turns this off.
  void SetFloor(int64_t floor);

  // The live weights are about to move on from `live_version`: keep a copy
  // if anything still needs that version.
  absl::Status BeforeUpdate(int64_t live_version);

  // Makes the parameters hold `version`'s weights (no-op for the live
  // version) until Restore. FailedPrecondition when it was not kept.
  absl::Status Use(int64_t version, int64_t live_version);
  void Restore();

  // Versions held as copies now, and the most held since the last reset.
  int depth() const { return static_cast<int>(copies_.size()); }
  int peak_depth() const { return peak_depth_; }
  void ResetPeak() { peak_depth_ = depth(); }

 private:
  bool Needed(int64_t version) const;
  void Prune();

  Backend* const backend_;            // borrowed
  const std::vector<Param*> params_;  // borrowed
  std::map<int64_t, int> pins_;
  std::map<int64_t, std::vector<Tensor>> copies_;
  // Copies no version needs any more, reused by BeforeUpdate: allocating a
  // stage's worth of weights for every update cost more than copying them
  // (fresh pages fault in one by one).
  static constexpr int kMaxSpares = 2;
  std::vector<std::vector<Tensor>> spares_;
  std::vector<Tensor> live_;  // the live values while another is in use
  int64_t floor_ = -1;
  int peak_depth_ = 0;
};

// Scoped WeightStash::Use: the live weights come back when it ends.
class StashedWeights {
 public:
  explicit StashedWeights(WeightStash* stash) : stash_(stash) {}  // may be null
  ~StashedWeights() { Restore(); }
  StashedWeights(const StashedWeights&) = delete;
  StashedWeights& operator=(const StashedWeights&) = delete;

  absl::Status Use(int64_t version, int64_t live_version) {
    absl::Status status = stash_->Use(version, live_version);
    active_ = status.ok();
    return status;
  }
  void Restore() {
    if (active_) stash_->Restore();
    active_ = false;
  }

 private:
  WeightStash* const stash_;  // borrowed
  bool active_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_WEIGHT_STASH_H_
