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
    groups_.push_back(Group{owner, in, out, 0, 0, false, Tensor(), Tensor(),
                            std::move(accumulate)});
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
  if (rows >= kMaxRows) {
    return group->accumulate(x, dy, /*first=*/0, /*complete=*/true).status();
  }
  return Append(group, x, dy, rows);
}

int64_t WeightGradQueue::stack_bytes() const {
  int64_t bytes = 0;
  for (const Group& g : groups_) {
    if (!g.x_stack.empty()) {
      bytes += static_cast<int64_t>(g.x_stack.bytes() + g.dy_stack.bytes());
    }
  }
  return bytes;
}

int64_t WeightGradQueue::HeldBytes(const Group& group, int64_t rows) {
  return rows * (group.in + group.out) * static_cast<int64_t>(sizeof(float));
}

absl::Status WeightGradQueue::Reserve(Group* group, int64_t rows) {
  const int64_t capacity = group->x_stack.empty() ? 0 : group->x_stack.dim(0);
  if (rows <= capacity) return absl::OkStatus();
  // Doubling, up to the most the queue holds: a step's first micro-batches
  // grow the stacks a few times, and later steps not at all.
  const int64_t grown =
      std::min(kMaxRows, std::max(rows, std::max<int64_t>(2 * capacity, 1)));
  ASSIGN_OR_RETURN(Tensor x,
                   backend_->AllocateUninitialized({grown, group->in}));
  ASSIGN_OR_RETURN(Tensor dy,
                   backend_->AllocateUninitialized({grown, group->out}));
  if (group->rows > 0) {
    RETURN_IF_ERROR(
        backend_->Copy(group->x_stack.f32(), group->rows * group->in, x.f32()));
    RETURN_IF_ERROR(backend_->Copy(group->dy_stack.f32(),
                                   group->rows * group->out, dy.f32()));
  }
  group->x_stack = std::move(x);
  group->dy_stack = std::move(dy);
  return absl::OkStatus();
}

absl::Status WeightGradQueue::Append(Group* group, const Tensor& x,
                                     const Tensor& dy, int64_t rows) {
  RETURN_IF_ERROR(Reserve(group, group->rows + rows));
  RETURN_IF_ERROR(
      backend_->Copy(x.f32(), rows * group->in,
                     group->x_stack.f32() + group->rows * group->in));
  RETURN_IF_ERROR(
      backend_->Copy(dy.f32(), rows * group->out,
                     group->dy_stack.f32() + group->rows * group->out));
  group->rows += rows;
  held_bytes_ += HeldBytes(*group, rows);
  return absl::OkStatus();
}

absl::Status WeightGradQueue::Run(Group* group) {
  const int64_t rows = group->rows;
  if (rows == 0) return absl::OkStatus();
  const int64_t done = group->done;
  group->rows = 0;
  group->done = 0;
  group->declined = false;
  held_bytes_ -= HeldBytes(*group, rows);
  run_bytes_ += HeldBytes(*group, rows - done);
  // One product over the held rows, in the order they came (or the rest of
  // it, after the rows run ahead).
  ASSIGN_OR_RETURN(const Tensor x, group->x_stack.SliceRows(0, rows));
  ASSIGN_OR_RETURN(const Tensor dy, group->dy_stack.SliceRows(0, rows));
  return group->accumulate(x, dy, done, /*complete=*/true).status();
}

absl::StatusOr<bool> WeightGradQueue::RunAhead(int64_t min_rows) {
  for (Group& group : groups_) {
    const int64_t rows = group.rows;
    // At least one row: a layer with nothing left to run never counts.
    if (group.declined || rows - group.done < std::max<int64_t>(min_rows, 1)) {
      continue;
    }
    ASSIGN_OR_RETURN(const Tensor x, group.x_stack.SliceRows(0, rows));
    ASSIGN_OR_RETURN(const Tensor dy, group.dy_stack.SliceRows(0, rows));
    ASSIGN_OR_RETURN(const bool ran, group.accumulate(x, dy, group.done,
                                                      /*complete=*/false));
    if (!ran) {
      group.declined = true;
      continue;
    }
    run_bytes_ += HeldBytes(group, rows - group.done);
    group.done = rows;
    return true;
  }
  return false;
}

absl::Status WeightGradQueue::Flush() {
  for (Group& group : groups_) RETURN_IF_ERROR(Run(&group));
  return absl::OkStatus();
}

absl::Status WeightGradQueue::FlushFor(const std::vector<Param*>& owners) {
  for (Group& group : groups_) {
    const bool named =
        std::find(owners.begin(), owners.end(), group.owner) != owners.end();
    if (named) RETURN_IF_ERROR(Run(&group));
  }
  return absl::OkStatus();
}

void WeightGradQueue::Discard() {
  for (Group& group : groups_) {
    group.rows = 0;
    group.done = 0;
    group.declined = false;
  }
  held_bytes_ = 0;
}

absl::StatusOr<int64_t> WeightGradQueue::Repeat(int64_t times) {
  for (const Group& group : groups_) {
    if (group.done > 0) {
      return absl::FailedPreconditionError(
          "weight-gradient queue: cannot repeat rows that ran ahead");
    }
  }
  int64_t fewest = 0;
  for (Group& group : groups_) {
    const int64_t rows = group.rows;
    if (rows == 0) continue;
    int64_t held = 1;
    // The first `rows` rows again, after those held (the views keep their
    // storage should the stacks grow).
    ASSIGN_OR_RETURN(const Tensor x, group.x_stack.SliceRows(0, rows));
    ASSIGN_OR_RETURN(const Tensor dy, group.dy_stack.SliceRows(0, rows));
    while (held < times && group.rows + rows <= kMaxRows) {
      RETURN_IF_ERROR(Append(&group, x, dy, rows));
      ++held;
    }
    fewest = fewest == 0 ? held : std::min(fewest, held);
  }
  return fewest == 0 ? 1 : fewest;
}

}  // namespace pipetrain
