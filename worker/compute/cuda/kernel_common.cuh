// Launch-shape helpers and block/warp reductions shared by the .cu files.
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_KERNEL_COMMON_CUH_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_KERNEL_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace pipetrain {
namespace cuda_kernels {

constexpr int kThreads = 256;
// Grid-stride loops cover any n; more blocks than this only add overhead.
constexpr int64_t kMaxBlocks = 8192;

inline int GridFor(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Threads for a block that walks one row of `cols` elements: a power of two
// between 32 and kMaxRowThreads, about one element per thread for short
// rows. Row kernels declare __launch_bounds__(kMaxRowThreads).
constexpr int kMaxRowThreads = 1024;
inline int RowThreads(int64_t cols) {
  int threads = 32;
  while (threads < kMaxRowThreads && threads < cols) threads *= 2;
  return threads;
}

// Index of the current thread in a grid-stride loop, and the stride.
__device__ inline int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t GlobalStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};

template <typename T, typename Op>
__device__ T WarpReduce(T value, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Reduces `value` over the block (blockDim.x a multiple of 32) and returns
// the result to every thread. Safe to call repeatedly in one kernel: the
// leading barrier keeps a call from overwriting `shared` while threads of
// the previous call still read it.
template <typename T, typename Op>
__device__ T BlockReduce(T value, Op op, T identity) {
  __shared__ T shared[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  value = WarpReduce(value, op);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : identity;
  return WarpReduce(value, op);
}

// Validates a float-encoded class id / token id: an integer in [0, limit)
// (the CPU backend's rule). Compared in double because float(limit) may
// round up past the last valid id.
__device__ inline bool ValidIndex(float value, int64_t limit) {
  const double v = value;
  return v >= 0.0 && v < static_cast<double>(limit) && v == floor(v);
}

// Records `index` as bad input in *first_bad, which the caller set to all
// ones (kNoBadIndex); the smallest bad index wins.
constexpr unsigned long long kNoBadIndex = ~0ull;
__device__ inline void RecordBadIndex(unsigned long long* first_bad,
                                      int64_t index) {
  atomicMin(first_bad, static_cast<unsigned long long>(index));
}

}  // namespace cuda_kernels
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_KERNEL_COMMON_CUH_
