// Launchers for the CUDA backend's kernels. Each one issues its kernels on
// `stream` and returns cudaGetLastError() (the launch status; faults inside
// the kernel surface at the next synchronizing call). Sizes are element
// counts as in backend.h; callers pass n > 0 / rows > 0 / cols > 0 and
// rows <= INT32_MAX for the row-wise launchers (one block per row).
//
// Plain C++ types only, so that the backend class compiles as ordinary C++
// and absl never passes through nvcc.
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_KERNELS_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipetrain {
namespace cuda_kernels {

// ---- Element-wise (elementwise_kernels.cu) ----
cudaError_t Fill(cudaStream_t stream, int64_t n, float value, float* x);
cudaError_t Axpby(cudaStream_t stream, int64_t n, float alpha, const float* x,
                  float beta, float* y);
cudaError_t Add(cudaStream_t stream, int64_t n, const float* a, const float* b,
                float* out);
cudaError_t AddRowBroadcast(cudaStream_t stream, int64_t rows, int64_t cols,
                            const float* bias, float* x);
cudaError_t ReluForward(cudaStream_t stream, int64_t n, const float* x,
                        float* y);
cudaError_t ReluBackward(cudaStream_t stream, int64_t n, const float* y,
                         const float* dy, float* dx);
cudaError_t GeluForward(cudaStream_t stream, int64_t n, const float* x,
                        float* y);
cudaError_t GeluBackward(cudaStream_t stream, int64_t n, const float* x,
                         const float* dy, float* dx);
cudaError_t Dropout(cudaStream_t stream, int64_t n, const float* x, float rate,
                    uint64_t seed, float* y);
// `m` may be null when momentum == 0.
cudaError_t SgdUpdate(cudaStream_t stream, int64_t n, float* w, const float* g,
                      float* m, float lr, float momentum, float weight_decay,
                      float grad_scale);
cudaError_t AdamWUpdate(cudaStream_t stream, int64_t n, float* w,
                        const float* g, float* m, float* v, float lr,
                        float beta1, float beta2, float eps, float weight_decay,
                        float bias1, float bias2, float grad_scale);

// ---- Reductions (reduction_kernels.cu) ----
// How many floats of scratch ColumnSum needs for [rows, cols] (0: none).
int64_t ColumnSumScratchFloats(int64_t rows, int64_t cols);
// out[c] = beta * out[c] + sum_r x[r, c]; beta == 0 overwrites `out`.
cudaError_t ColumnSum(cudaStream_t stream, int64_t rows, int64_t cols,
                      const float* x, float beta, float* out, float* scratch);
// Doubles of device scratch SumSquares needs.
constexpr int64_t kSumSquaresScratchDoubles = 1025;
// *result (device) = sum of x[i]^2 in double; `scratch` holds
// kSumSquaresScratchDoubles doubles, `result` may point into it.
cudaError_t SumSquares(cudaStream_t stream, int64_t n, const float* x,
                       double* scratch, double* result);

// ---- Row-wise (rowwise_kernels.cu) ----
cudaError_t SoftmaxForward(cudaStream_t stream, int64_t rows, int64_t cols,
                           int64_t causal_t, const float* x, float* y);
cudaError_t SoftmaxBackward(cudaStream_t stream, int64_t rows, int64_t cols,
                            const float* y, const float* dy, float* dx);
cudaError_t LayerNormForward(cudaStream_t stream, int64_t rows, int64_t cols,
                             const float* x, const float* gamma,
                             const float* beta, float eps, float* y,
                             float* mean, float* rstd);
// How many floats of scratch LayerNormBackward needs.
int64_t LayerNormBackwardScratchFloats(int64_t rows, int64_t cols);
cudaError_t LayerNormBackward(cudaStream_t stream, int64_t rows, int64_t cols,
                              const float* x, const float* gamma,
                              const float* mean, const float* rstd,
                              const float* dy, float* dx, float* dgamma,
                              float* dbeta, float* scratch);
// Bad input is reported through `first_bad` (device): the caller fills it
// with all-one bytes (cudaMemset 0xff), and a kernel that meets bad input
// lowers it to the smallest bad row / position.
//
// A label is bad unless it is an integer in [0, cols).
cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int64_t rows, int64_t cols,
                                const float* logits, const float* labels,
                                float* probs, float* loss, float* correct,
                                unsigned long long* first_bad);
cudaError_t SoftmaxCrossEntropyBackward(cudaStream_t stream, int64_t rows,
                                        int64_t cols, const float* probs,
                                        const float* labels, float scale,
                                        float* dlogits);

// ---- Gather / scatter / layout (layout_kernels.cu) ----
// An id is bad unless it is an integer in [0, vocab); see `first_bad` above.
cudaError_t EmbeddingForward(cudaStream_t stream, int64_t n, int64_t dim,
                             int64_t vocab, const float* ids,
                             const float* table, float* out,
                             unsigned long long* first_bad);
// Rows with a negative id are skipped (the op has no vocab to check against).
cudaError_t EmbeddingBackward(cudaStream_t stream, int64_t n, int64_t dim,
                              const float* ids, const float* dy, float* dtable);
// Output dimension k is input dimension perm[k] (see Permute4).
cudaError_t Permute(cudaStream_t stream, const int64_t dims[4],
                    const int perm[4], const float* in, float* out);

}  // namespace cuda_kernels
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_KERNELS_H_
