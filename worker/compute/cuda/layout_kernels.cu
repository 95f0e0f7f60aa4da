// Gather, scatter and layout kernels: one thread per output element.
#include "worker/compute/cuda/cuda_kernels.h"
#include "worker/compute/cuda/kernel_common.cuh"

namespace pipetrain {
namespace cuda_kernels {
namespace {

// out[i, :] = table[ids[i], :]. Threads i < n also check ids[i] (so ids
// are checked even when dim == 0); rows with a bad id are zeroed.
__global__ void EmbeddingForwardKernel(int64_t n, int64_t dim, int64_t vocab,
                                       const float* ids, const float* table,
                                       float* out,
                                       unsigned long long* first_bad) {
  const int64_t total = n * dim;
  const int64_t end = total > n ? total : n;
  for (int64_t i = GlobalIndex(); i < end; i += GlobalStride()) {
    if (i < n && !ValidIndex(ids[i], vocab)) RecordBadIndex(first_bad, i);
    if (i >= total) continue;
    const int64_t row = i / dim;
    const float id = ids[row];
    out[i] = ValidIndex(id, vocab)
                 ? table[static_cast<int64_t>(id) * dim + (i - row * dim)]
                 : 0.0f;
  }
}

// dtable[ids[i], :] += dy[i, :]; repeated ids meet in atomicAdd.
__global__ void EmbeddingBackwardKernel(int64_t total, int64_t dim,
                                        const float* ids, const float* dy,
                                        float* dtable) {
  for (int64_t i = GlobalIndex(); i < total; i += GlobalStride()) {
    const int64_t row = i / dim;
    const float id = ids[row];
    if (!(id >= 0.0f)) continue;
    atomicAdd(dtable + static_cast<int64_t>(id) * dim + (i - row * dim), dy[i]);
  }
}

struct PermuteShape {
  int64_t out_dims[4];
  int64_t in_strides[4];  // input stride of output dimension k
};

// Walks the output in order (coalesced writes) and gathers from the input.
__global__ void PermuteKernel(int64_t total, PermuteShape shape,
                              const float* in, float* out) {
  for (int64_t i = GlobalIndex(); i < total; i += GlobalStride()) {
    int64_t rest = i;
    int64_t src = 0;
    for (int k = 3; k >= 0; --k) {
      const int64_t coord = rest % shape.out_dims[k];
      rest /= shape.out_dims[k];
      src += coord * shape.in_strides[k];
    }
    out[i] = in[src];
  }
}

}  // namespace

cudaError_t EmbeddingForward(cudaStream_t stream, int64_t n, int64_t dim,
                             int64_t vocab, const float* ids,
                             const float* table, float* out,
                             unsigned long long* first_bad) {
  const int64_t total = n * dim > n ? n * dim : n;
  EmbeddingForwardKernel<<<GridFor(total), kThreads, 0, stream>>>(
      n, dim, vocab, ids, table, out, first_bad);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(cudaStream_t stream, int64_t n, int64_t dim,
                              const float* ids, const float* dy,
                              float* dtable) {
  const int64_t total = n * dim;
  EmbeddingBackwardKernel<<<GridFor(total), kThreads, 0, stream>>>(
      total, dim, ids, dy, dtable);
  return cudaGetLastError();
}

cudaError_t Permute(cudaStream_t stream, const int64_t dims[4],
                    const int perm[4], const float* in, float* out) {
  int64_t in_strides[4];
  in_strides[3] = 1;
  for (int d = 2; d >= 0; --d) in_strides[d] = in_strides[d + 1] * dims[d + 1];
  PermuteShape shape;
  int64_t total = 1;
  for (int k = 0; k < 4; ++k) {
    shape.out_dims[k] = dims[perm[k]];
    shape.in_strides[k] = in_strides[perm[k]];
    total *= dims[k];
  }
  PermuteKernel<<<GridFor(total), kThreads, 0, stream>>>(total, shape, in, out);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace pipetrain
