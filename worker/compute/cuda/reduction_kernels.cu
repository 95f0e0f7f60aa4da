// Column sums and the sum of squares.
#include "worker/compute/cuda/column_reduce.cuh"
#include "worker/compute/cuda/cuda_kernels.h"
#include "worker/compute/cuda/kernel_common.cuh"

namespace pipetrain {
namespace cuda_kernels {
namespace {

constexpr int kSumSquaresBlocks = 1024;
static_assert(kSumSquaresBlocks < kSumSquaresScratchDoubles,
              "scratch holds one partial per block");

// Each block writes the double-precision sum of squares of its share.
__global__ void SumSquaresPartialKernel(int64_t n, const float* x,
                                        double* partial) {
  double sum = 0.0;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const double v = x[i];
    sum += v * v;
  }
  sum = BlockReduce(sum, SumOp(), 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// One block of kSumSquaresBlocks threads sums the partials in a fixed order.
__global__ void __launch_bounds__(kSumSquaresBlocks)
    SumPartialsKernel(int count, const double* partial, double* result) {
  double v = static_cast<int>(threadIdx.x) < count ? partial[threadIdx.x] : 0.0;
  v = BlockReduce(v, SumOp(), 0.0);
  if (threadIdx.x == 0) *result = v;
}

}  // namespace

int64_t ColumnSumScratchFloats(int64_t rows, int64_t cols) {
  const int64_t chunks = ColumnChunks(rows, cols);
  return chunks > 1 ? chunks * cols : 0;
}

cudaError_t ColumnSum(cudaStream_t stream, int64_t rows, int64_t cols,
                      const float* x, float beta, float* out, float* scratch) {
  return ColumnReduce(stream, rows, cols, LoadMatrix{x, cols}, beta, out,
                      scratch);
}

cudaError_t SumSquares(cudaStream_t stream, int64_t n, const float* x,
                       double* scratch, double* result) {
  int blocks = GridFor(n);
  if (blocks > kSumSquaresBlocks) blocks = kSumSquaresBlocks;
  SumSquaresPartialKernel<<<blocks, kThreads, 0, stream>>>(n, x, scratch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SumPartialsKernel<<<1, kSumSquaresBlocks, 0, stream>>>(blocks, scratch,
                                                         result);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace pipetrain
