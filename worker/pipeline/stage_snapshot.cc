#include "worker/pipeline/stage_snapshot.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// Copies kept: the newest, and the one before while it may still be
// streamed out.
constexpr size_t kHeldSnapshots = 2;
// Requests for boundaries not reached yet (each costs a set entry only).
constexpr size_t kMaxRequested = 64;

}  // namespace

StageSnapshots::StageSnapshots(int64_t every, int64_t start_step)
    : every_(every), start_step_(start_step), begun_(start_step - 1) {}

bool StageSnapshots::Wanted(int64_t step) const {
  if (requested_.count(step) > 0) return true;
  // The start step's state is what the stage was given: nothing to save.
  return every_ > 0 && step > start_step_ && step % every_ == 0;
}

absl::StatusOr<int64_t> StageSnapshots::Request(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot step ", step, " must be >= 0"));
  }
  absl::MutexLock lock(&mu_);
  if (held_.count(step) > 0 || capturing_ == step) return step;
  if (step <= begun_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the stage has begun step ", begun_, ", past the boundary before step ",
        step, "; the next step it can snapshot is ", begun_ + 1));
  }
  if (requested_.size() >= kMaxRequested && requested_.count(step) == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat(requested_.size(), " snapshot requests already wait"));
  }
  requested_.insert(step);
  return step;
}

absl::Status StageSnapshots::AtBoundary(int64_t step, bool entering,
                                        const Capture& capture) {
  {
    absl::MutexLock lock(&mu_);
    if (entering) begun_ = std::max(begun_, step);
    if (!Wanted(step) || held_.count(step) > 0) return absl::OkStatus();
    capturing_ = step;
  }
  absl::StatusOr<StageStateSnapshot> taken = capture();
  absl::MutexLock lock(&mu_);
  capturing_ = -1;
  if (!taken.ok()) {
    return absl::Status(taken.status().code(),
                        absl::StrCat("snapshot before step ", step, ": ",
                                     taken.status().message()));
  }
  requested_.erase(step);
  held_[step] =
      std::make_shared<const StageStateSnapshot>(std::move(taken).value());
  while (held_.size() > kHeldSnapshots) held_.erase(held_.begin());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const StageStateSnapshot>> StageSnapshots::Find(
    int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(step);
  if (it != held_.end()) return it->second;
  std::string held;
  for (const auto& [s, snapshot] : held_) {
    absl::StrAppend(&held, held.empty() ? "" : ", ", s);
  }
  return absl::NotFoundError(
      absl::StrCat("no snapshot of step ", step,
                   " is held (held: ", held.empty() ? "none" : held,
                   "; the stage has begun step ", begun_, ")"));
}

std::vector<int64_t> StageSnapshots::HeldSteps() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  for (const auto& [step, snapshot] : held_) out.push_back(step);
  return out;
}

namespace {

std::vector<const Model*> ChunkModels(const StageCompute& compute) {
  std::vector<const Model*> out;
  for (const std::unique_ptr<Model>& m : compute.models())
    out.push_back(m.get());
  return out;
}

}  // namespace

StateLayout StageStateLayout(const StageCompute& compute) {
  return StateLayout::Of(ChunkModels(compute), *compute.optimizer());
}

absl::StatusOr<StageStateSnapshot> CaptureStageState(
    const StageCompute& compute, int64_t step) {
  StageStateSnapshot out;
  out.step = step;
  out.weight_version = compute.weight_version();
  ASSIGN_OR_RETURN(
      out.state, ExportTrainingState(ChunkModels(compute), *compute.optimizer(),
                                     compute.backend()));
  return out;
}

absl::Status RestoreStageState(const TrainingState& state,
                               StageCompute* compute) {
  std::vector<Model*> models;
  for (const std::unique_ptr<Model>& m : compute->models()) {
    models.push_back(m.get());
  }
  return ImportTrainingState(state, models, compute->optimizer(),
                             compute->backend());
}

}  // namespace pipetrain
