// Column sums of a [rows, cols] matrix given by a loader `load(r, c)`:
//   out[c] = beta * out[c] + sum_r load(r, c)   (beta == 0 overwrites).
//
// Blocks of 32 columns x 8 row-lanes read rows coalesced. Tall matrices are
// cut into row chunks so that enough blocks run; each chunk writes a partial
// row to scratch and a second pass sums the partials in a fixed order (no
// atomics, so the result is the same on every run).
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_COLUMN_REDUCE_CUH_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_COLUMN_REDUCE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace pipetrain {
namespace cuda_kernels {

constexpr int kColumnTile = 32;
constexpr int kColumnLanes = 8;

// Row chunks for a [rows, cols] column reduction (1: no scratch needed).
inline int64_t ColumnChunks(int64_t rows, int64_t cols) {
  constexpr int64_t kTargetBlocks = 512;
  constexpr int64_t kMinRowsPerChunk = 64;
  const int64_t tiles = (cols + kColumnTile - 1) / kColumnTile;
  const int64_t wanted = kTargetBlocks / tiles;
  const int64_t most = (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
  const int64_t chunks = wanted < most ? wanted : most;
  return chunks > 1 ? chunks : 1;
}

template <typename Load>
__global__ void ColumnReduceKernel(int64_t rows, int64_t cols,
                                   int64_t rows_per_chunk, Load load,
                                   float beta, float* out, float* partial) {
  __shared__ float tile[kColumnLanes][kColumnTile + 1];
  const int64_t c =
      static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end =
      begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnLanes) {
      sum += load(r, c);
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int lane = 1; lane < kColumnLanes; ++lane)
    sum += tile[lane][threadIdx.x];
  if (partial != nullptr) {
    partial[blockIdx.y * cols + c] = sum;
  } else {
    out[c] = beta == 0.0f ? sum : beta * out[c] + sum;
  }
}

struct LoadMatrix {
  const float* x;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const {
    return x[r * cols + c];
  }
};

// `scratch` holds ColumnChunks(rows, cols) * cols floats when that is > 1.
template <typename Load>
cudaError_t ColumnReduce(cudaStream_t stream, int64_t rows, int64_t cols,
                         Load load, float beta, float* out, float* scratch) {
  const int64_t chunks = ColumnChunks(rows, cols);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 block(kColumnTile, kColumnLanes);
  const unsigned tiles =
      static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile);
  if (chunks == 1) {
    ColumnReduceKernel<<<dim3(tiles, 1), block, 0, stream>>>(
        rows, cols, rows, load, beta, out, nullptr);
    return cudaGetLastError();
  }
  ColumnReduceKernel<<<dim3(tiles, static_cast<unsigned>(chunks)), block, 0,
                       stream>>>(rows, cols, rows_per_chunk, load, beta, out,
                                 scratch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ColumnReduceKernel<<<dim3(tiles, 1), block, 0, stream>>>(
      chunks, cols, chunks, LoadMatrix{scratch, cols}, beta, out, nullptr);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_COLUMN_REDUCE_CUH_
