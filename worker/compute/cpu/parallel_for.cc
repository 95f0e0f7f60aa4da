#include "worker/compute/cpu/parallel_for.h"

#include <algorithm>

namespace pipetrain {

ParallelFor::ParallelFor(int threads) : threads_(std::max(1, threads)) {
  for (int i = 1; i < threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ParallelFor::~ParallelFor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

void ParallelFor::RunChunk(int index, int chunks, int64_t n,
                           const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t per = (n + chunks - 1) / chunks;
  const int64_t begin = std::min(n, index * per);
  const int64_t end = std::min(n, begin + per);
  if (begin < end) fn(begin, end);
}

void ParallelFor::Run(int64_t n, int64_t grain,
                      const std::function<void(int64_t, int64_t)>& fn) {
  const int chunks = static_cast<int>(std::min<int64_t>(
      threads_, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1))));
  if (chunks <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  work_cv_.SignalAll();
  RunChunk(0, chunks, n, fn);
  absl::MutexLock lock(&mu_);
  while (pending_ != 0) done_cv_.Wait(&mu_);
  job_ = nullptr;
}

void ParallelFor::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int chunks;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      if (index >= chunks_) continue;  // this round needs fewer threads
      job = job_;
      n = n_;
      chunks = chunks_;
    }
    RunChunk(index, chunks, n, *job);
    {
      absl::MutexLock lock(&mu_);
      --pending_;
    }
    done_cv_.Signal();
  }
}

}  // namespace pipetrain
