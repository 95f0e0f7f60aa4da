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
    if (Needed(it->first)) {
      ++it;
      continue;
    }
    // Kept for the next BeforeUpdate unless a parameter still holds one of
    // its tensors (a Use in force).
    const bool unshared = std::all_of(
        it->second.begin(), it->second.end(),
        [](const Tensor& t) { return t.storage().use_count() == 1; });
    if (unshared && static_cast<int>(spares_.size()) < kMaxSpares) {
      spares_.push_back(std::move(it->second));
    }
    it = copies_.erase(it);
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
  if (!spares_.empty()) {
    copy = std::move(spares_.back());
    spares_.pop_back();
  } else {
    for (const Param* p : params_) {
      ASSIGN_OR_RETURN(Tensor t,
                       backend_->AllocateUninitialized(p->value.shape()));
      copy.push_back(t);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& value = params_[i]->value;
    RETURN_IF_ERROR(backend_->Copy(value.f32(), value.numel(), copy[i].f32()));
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
