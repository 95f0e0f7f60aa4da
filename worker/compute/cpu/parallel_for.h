// A small fork-join pool for the CPU backend's loops.
//
// Why not OpenMP: idle OpenMP threads spin for a while after each parallel
// region, and on a machine with as many cores as BLAS threads that spinning
// steals the cores OpenBLAS's own threads need right after (measured: the
// 2-thread training step ran at half speed). These workers sleep on a
// condition variable instead.
//
// Thread-safe for one caller at a time (the backend's compute thread);
// ParallelFor calls must not nest.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_PARALLEL_FOR_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_PARALLEL_FOR_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain {

class ParallelFor {
 public:
  // `threads` counts the caller: threads - 1 workers are started.
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  int threads() const { return threads_; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), at most one per
  // thread, and returns when all are done. Runs inline when n < 2 * grain.
  void Run(int64_t n, int64_t grain,
           const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  // The chunk of [0, n_) that thread `index` of `chunks` runs.
  void RunChunk(int index, int chunks, int64_t n,
                const std::function<void(int64_t, int64_t)>& fn);

  const int threads_;
  std::vector<std::thread> workers_;

  absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int chunks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_PARALLEL_FOR_H_
