// The CPU backend: OpenBLAS sgemm for dense algebra, OpenMP-parallel loops
// over the shared element-wise math for everything else. It is the reference
// every other backend is checked against.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_CPU_BACKEND_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_CPU_BACKEND_H_

#include <memory>

#include "worker/compute/backend.h"

namespace pipetrain {

// `threads` sets the BLAS and element-wise thread count for this process
// (0: all cores). OpenBLAS keeps one thread count per process, so the last
// created CPU backend's count applies.
std::unique_ptr<Backend> CreateCpuBackend(int threads);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_CPU_BACKEND_H_
