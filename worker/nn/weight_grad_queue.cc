#include "worker/nn/weight_grad_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::Status WeightGradQueue::Add(const void* owner, int64_t in, int64_t out,
                                  const Tensor& x, const Tensor& dy,
                                  Accumulate accumulate) {
  const int64_t rows = in > 0 ? x.numel() / in : 0;
  if (in <= 0 || out <= 0 || rows * in != x.numel() ||
      rows * out != dy.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight-gradient queue: x of ", x.numel(), " and dy of ", dy.numel(),
        " elements are not rows of ", in, " and ", out));
  }
  Group* group = nullptr;
  for (Group& g : groups_) {
    if (g.owner == owner) group = &g;
  }
  if (group == nullptr) {
    groups_.push_back(Group{owner, in, out, 0, {}, {}, std::move(accumulate)});
    group = &groups_.back();
  } else if (group->in != in || group->out != out) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight-gradient queue: a layer of ", group->in, " -> ",
                     group->out, " was given rows of ", in, " -> ", out));
  }
  // Room for these rows: run what is held first (in the order it came).
  if (group->rows > 0 && group->rows + rows > kMaxRows) {
    RETURN_IF_ERROR(Run(group));
  }
  // Enough rows on their own: nothing to gain from holding them.
  if (rows >= kMaxRows) return group->accumulate(x, dy);
  group->xs.push_back(x);
  group->dys.push_back(dy);
  group->rows += rows;
  held_bytes_ += static_cast<int64_t>(x.bytes() + dy.bytes());
  return absl::OkStatus();
}

absl::Status WeightGradQueue::Run(Group* group) {
  if (group->xs.empty()) return absl::OkStatus();
  std::vector<Tensor> xs = std::move(group->xs);
  std::vector<Tensor> dys = std::move(group->dys);
  const int64_t rows = group->rows;
  group->xs.clear();
  group->dys.clear();
  group->rows = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    held_bytes_ -= static_cast<int64_t>(xs[i].bytes() + dys[i].bytes());
  }
  if (xs.size() == 1) return group->accumulate(xs[0], dys[0]);
  // Stack the micro-batches' rows, in the order they came, so one product
  // runs over all of them.
  ASSIGN_OR_RETURN(Tensor x,
                   backend_->AllocateUninitialized({rows, group->in}));
  ASSIGN_OR_RETURN(Tensor dy,
                   backend_->AllocateUninitialized({rows, group->out}));
  int64_t row = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t r = xs[i].numel() / group->in;
    RETURN_IF_ERROR(
        backend_->Copy(xs[i].f32(), r * group->in, x.f32() + row * group->in));
    RETURN_IF_ERROR(backend_->Copy(dys[i].f32(), r * group->out,
                                   dy.f32() + row * group->out));
    row += r;
  }
  return group->accumulate(x, dy);
}

absl::Status WeightGradQueue::Flush() {
  for (Group& group : groups_) RETURN_IF_ERROR(Run(&group));
  return absl::OkStatus();
}

void WeightGradQueue::Discard() {
  for (Group& group : groups_) {
    group.xs.clear();
    group.dys.clear();
    group.rows = 0;
  }
  held_bytes_ = 0;
}

int64_t WeightGradQueue::Repeat(int64_t times) {
  int64_t fewest = 0;
  for (Group& group : groups_) {
    if (group.xs.empty()) continue;
    const std::vector<Tensor> xs = group.xs;
    const std::vector<Tensor> dys = group.dys;
    const int64_t rows = group.rows;
    int64_t held = 1;
    while (held < times && group.rows + rows <= kMaxRows) {
      for (size_t i = 0; i < xs.size(); ++i) {
        group.xs.push_back(xs[i]);
        group.dys.push_back(dys[i]);
        held_bytes_ += static_cast<int64_t>(xs[i].bytes() + dys[i].bytes());
      }
      group.rows += rows;
      ++held;
    }
    fewest = fewest == 0 ? held : std::min(fewest, held);
  }
  return fewest == 0 ? 1 : fewest;
}

}  // namespace pipetrain
