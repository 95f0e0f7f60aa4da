// Weight-gradient products held back and run together.
//
// A linear layer's weight gradient over a micro-batch is dW (+)= x^T dy, a
// product whose depth is the micro-batch's rows. With few rows (32 for a
// batch of 256 in 8 micro-batches) each product reads and writes the whole
// of dW for little arithmetic, and on a CPU it ran at about 0.7 of the rate
// of one product over the whole batch (the weight gradient of a 2048 x 2048
// layer, one core, between the other layers' products as a step runs them:
// 14 ms for 8 micro-batches of 32 rows, 10 ms in one product of 256). A
// queue keeps each layer's (x, dy) pairs and runs them as one product when
// the caller flushes (before anything reads the gradients: the optimizer
// step, a gradient norm), or earlier when the next micro-batch would take
// the layer past kMaxRows rows held. Holding runs no product inside a
// micro-batch's backward, so its input gradient leaves as early as before.
//
// The gradient is the same sum, rounded in a different order: the rows of
// the held micro-batches go through one product, in the order they came.
// Holding a micro-batch copies its x and dy, while they are still in
// cache, into the layer's two stacks, which the product then reads; the
// stacks stay allocated from one flush to the next (at most kMaxRows rows
// of each per layer, the most the queue holds), so a step's holding
// touches no fresh memory: stacked anew every step, the first stage of
// bench_scaling's MLP took about 3,000 page faults a step. A micro-batch of
// kMaxRows rows or more is not held.
//
// A stage waiting for a message with nothing else to do may run a layer's
// held rows ahead of the flush (RunAhead): the weight product over the rows
// held so far goes into the gradient now, and the flush carries each sum on
// from there (Backend::GemmResume), so the gradient has the bits of the one
// product over every row. The rows stay held until the flush, which sums
// the rest of the layer's gradients (its bias) over all of them. A layer
// runs ahead only where its backend can carry the sums on exactly and its
// gradient held nothing before these rows; otherwise it declines, and its
// rows wait for the flush as before.
//
// Thread-compatible: used by one stage's compute thread, like its layers.
#ifndef PIPETRAIN_WORKER_NN_WEIGHT_GRAD_QUEUE_H_
#define PIPETRAIN_WORKER_NN_WEIGHT_GRAD_QUEUE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "spec/schedule.h"
#include "worker/compute/backend.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

struct Param;

class WeightGradQueue {
 public:
  // A layer's weight-gradient product over rows [first, rows) of x
  // [rows, in] and dy [rows, out]: accumulates their x^T dy into its
  // gradients. With first > 0 an earlier call (complete = false) summed
  // rows [0, first), and this one carries those sums on. `complete`: the
  // last call for these rows, which also sums whatever else the layer sums
  // over all of them (its bias). A call with complete = false and first = 0
  // asks to run the rows ahead (RunAhead); the layer returns false, doing
  // nothing, when it could not carry the sums on exactly later. Calls with
  // complete = true return true.
  using Accumulate = std::function<absl::StatusOr<bool>(
      const Tensor& x, const Tensor& dy, int64_t first, bool complete)>;

  // The most rows a layer holds; about where the product's depth stops
  // paying (bench_scaling's MLP: 2048 x 2048 layers).
  static constexpr int64_t kMaxRows = kMaxHeldWeightGradRows;

  // `backend` (borrowed) allocates and copies the stacked operands.
  explicit WeightGradQueue(Backend* backend) : backend_(backend) {}
  WeightGradQueue(const WeightGradQueue&) = delete;
  WeightGradQueue& operator=(const WeightGradQueue&) = delete;

  // Holds x [rows, in] and dy [rows, out] of the layer `owner` (any stable
  // pointer naming it), first running the layer's held rows through
  // `accumulate` if these would take it past kMaxRows; runs x and dy at
  // once when they have kMaxRows rows or more. `in`, `out` and
  // `accumulate` are the owner's first Add's: `in` and `out` must not
  // change, and later `accumulate`s are not kept.
  absl::Status Add(const void* owner, int64_t in, int64_t out, const Tensor& x,
                   const Tensor& dy, Accumulate accumulate);
  // Runs every layer's held rows, layers in the order they first came.
  absl::Status Flush();
  // Runs ahead the held rows of one layer: the first, in the order they
  // came, with at least `min_rows` (and one) held rows not yet run, that does
  // not decline (Accumulate). Its rows stay held until its flush, which runs
  // the rest. Returns whether a layer ran.
  absl::StatusOr<bool> RunAhead(int64_t min_rows);
  // Runs the held rows of the layers named by any of `owners` (the
  // pointers their Adds gave; a Linear names itself by its weight Param,
  // so a layer's params() flush its products), in the order they first
  // came; the others stay held.
  absl::Status FlushFor(const std::vector<Param*>& owners);
  // Drops what is held (an abandoned step's micro-batches).
  void Discard();
  // Holds each layer's held micro-batches again, as if a step brought that
  // many more alike, until it holds `times` as many rows or would pass
  // kMaxRows; returns the fewest times a layer now holds its rows (1 when
  // nothing is held). For the profiler: one micro-batch's share of the
  // product a step runs over all of its micro-batches. FailedPrecondition
  // while rows have run ahead.
  absl::StatusOr<int64_t> Repeat(int64_t times);
  // Bytes of the x and dy rows held.
  int64_t held_bytes() const { return held_bytes_; }
  // Bytes of held x and dy rows run through their products so far (ahead
  // or at a flush, each row once; not those dropped by Discard): never
  // decreases.
  int64_t run_bytes() const { return run_bytes_; }
  // Bytes of the layers' stacks, held rows or not.
  int64_t stack_bytes() const;

 private:
  struct Group {
    const void* owner = nullptr;
    int64_t in = 0;
    int64_t out = 0;
    int64_t rows = 0;       // held: the stacks' first rows
    int64_t done = 0;       // of those, the rows run ahead (RunAhead)
    bool declined = false;  // the layer declined to run these rows ahead
    // [capacity, in] and [capacity, out]; empty until the first hold.
    Tensor x_stack;
    Tensor dy_stack;
    Accumulate accumulate;
  };
  // Bytes of `rows` rows of a group's x and dy.
  static int64_t HeldBytes(const Group& group, int64_t rows);
  // Room in the stacks for `rows` held rows, keeping those held.
  absl::Status Reserve(Group* group, int64_t rows);
  // Appends x and dy's rows (`rows` of them) to the stacks.
  absl::Status Append(Group* group, const Tensor& x, const Tensor& dy,
                      int64_t rows);
  // The held rows' last call (the flush's): the rows not run ahead, and
  // everything else the layer sums over them all.
  absl::Status Run(Group* group);

  Backend* const backend_;  // borrowed
  std::vector<Group> groups_;
  int64_t held_bytes_ = 0;
  int64_t run_bytes_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_NN_WEIGHT_GRAD_QUEUE_H_
