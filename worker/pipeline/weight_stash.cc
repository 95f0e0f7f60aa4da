#include "worker/pipeline/weight_stash.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

bool WeightStash::Needed(int64_t version) const {
  auto it = pins_.find(version);
  if (it != pins_.end() && it->second > 0) return true;
  return floor_ >= 0 && version >= floor_;
}

void WeightStash::Prune() {
  for (auto it = copies_.begin(); it != copies_.end();) {
    it = Needed(it->first) ? std::next(it) : copies_.erase(it);
  }
}

void WeightStash::Unpin(int64_t version) {
  auto it = pins_.find(version);
  if (it != pins_.end() && --it->second <= 0) pins_.erase(it);
  Prune();
}

void WeightStash::SetFloor(int64_t floor) {
  floor_ = floor;
  Prune();
}

absl::Status WeightStash::BeforeUpdate(int64_t live_version) {
  if (!Needed(live_version) || copies_.count(live_version)) {
    return absl::OkStatus();
  }
  std::vector<Tensor> copy;
  for (const Param* p : params_) {
    ASSIGN_OR_RETURN(Tensor t,
                     backend_->AllocateUninitialized(p->value.shape()));
    RETURN_IF_ERROR(backend_->Copy(p->value.f32(), p->value.numel(), t.f32()));
    copy.push_back(t);
  }
  copies_[live_version] = std::move(copy);
  peak_depth_ = std::max(peak_depth_, depth());
  return absl::OkStatus();
}

absl::Status WeightStash::Use(int64_t version, int64_t live_version) {
  if (version == live_version) return absl::OkStatus();
  auto it = copies_.find(version);
  if (it == copies_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight version ", version,
                     " is not stashed (live version ", live_version, ")"));
  }
  live_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    live_.push_back(params_[i]->value);
    params_[i]->value = it->second[i];
    ++params_[i]->version;
  }
  return absl::OkStatus();
}

void WeightStash::Restore() {
  if (live_.empty()) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->value = live_[i];
    ++params_[i]->version;
  }
  live_.clear();
}

}  // namespace pipetrain
