// Backend: the numeric operations a stage needs, on one device.
//
// Every pointer argument is a device pointer of this backend (host memory for
// the CPU backend) holding float32 values, row-major. Sizes are element
// counts. Operations are issued in order on the backend's single stream; the
// results are visible to later operations at once and to the host after
// CopyToHost or Synchronize. Every operation returns a Status so that device
// errors reach the caller instead of aborting.
//
// Thread-compatibility: a Backend is used by one thread at a time (the stage
// executor's compute thread); distinct backends are independent.
#ifndef PIPETRAIN_WORKER_COMPUTE_BACKEND_H_
#define PIPETRAIN_WORKER_COMPUTE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

// Parameters of a 4-D permutation: out[i0..i3 permuted] = in[i0, i1, i2, i3].
struct Permute4 {
  int64_t dims[4];  // input dimensions
  int perm[4];      // output dimension k is input dimension perm[k]
};

// A right-hand GEMM operand laid out for a backend's kernel
// (Backend::PackOperand): op(B) as [k, n], in host memory.
struct PackedOperand {
  int64_t k = 0;
  int64_t n = 0;
  std::vector<float> data;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // Human-readable description, e.g. "cpu (openblas Haswell, packed avx512, 2
  // threads)".
  virtual std::string Describe() const = 0;

  // ---- Memory ----
  // Bytes this backend holds on its device, for monitoring. The default
  // (CPU, whose device is host memory) is the resident set size of the
  // whole process from /proc/self/statm; the CUDA backend reports the GPU
  // memory its caching allocator reserved from the driver. -1 when
  // unknown. Thread-safe.
  virtual int64_t MemoryBytes() const;
  // A new tensor on this device. Contents are zero.
  virtual absl::StatusOr<Tensor> Allocate(const Shape& shape) = 0;
  // Like Allocate, but the contents are unspecified (cheaper).
  virtual absl::StatusOr<Tensor> AllocateUninitialized(const Shape& shape) = 0;
  virtual absl::Status CopyFromHost(const float* host, int64_t n,
                                    float* dst) = 0;
  virtual absl::Status CopyToHost(const float* src, int64_t n, float* host) = 0;
  virtual absl::Status Copy(const float* src, int64_t n, float* dst) = 0;
  // Waits for every issued operation to finish.
  virtual absl::Status Synchronize() = 0;

  // ---- Dense linear algebra ----
  // C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [m,k],
  // op(B) is [k,n]. lda/ldb/ldc are row strides of the stored matrices.
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float* a, int64_t lda,
                            const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc) = 0;
  // `batch` independent Gemms; matrix i starts at a + i*stride_a, etc.
  virtual absl::Status GemmStridedBatched(bool trans_a, bool trans_b, int64_t m,
                                          int64_t n, int64_t k, float alpha,
                                          const float* a, int64_t lda,
                                          int64_t stride_a, const float* b,
                                          int64_t ldb, int64_t stride_b,
                                          float beta, float* c, int64_t ldc,
                                          int64_t stride_c, int64_t batch) = 0;

  // ---- Products with an operand reused unchanged ----
  // A weight multiplies every micro-batch of a step; a backend may lay it
  // out once for its kernel instead of in every Gemm. PackOperand stores
  // op(B) ([k,n]; B stored as for Gemm) in *packed, reusing its memory, and
  // returns false when this backend has no such path (the caller then uses
  // Gemm; the default). GemmPacked: C[m,n] = A[m,k] op(B), A and C
  // row-major with strides lda and ldc.
  virtual absl::StatusOr<bool> PackOperand(bool trans_b, int64_t k, int64_t n,
                                           const float* b, int64_t ldb,
                                           PackedOperand* packed);
  virtual absl::Status GemmPacked(int64_t m, const float* a, int64_t lda,
                                  const PackedOperand& packed, float* c,
                                  int64_t ldc);

  // ---- A sum split in two ----
  // Whether a product op(A) op(B) ([m, n], depth up to `max_k`) can be run
  // as Gemm (alpha 1, beta 0) over its first rows of depth and GemmResume
  // over the rest, with the bits of one Gemm over all of them (which the
  // same backend, given all the rows at once, would compute). False (the
  // default) where the backend cannot promise those bits.
  virtual bool ResumesSums(bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t max_k) const;
  // C[m,n] += op(A) op(B) as the rest of the sum C holds: each output's sum
  // goes on from C's value (ResumesSums). FailedPrecondition where
  // ResumesSums is false for the shape.
  virtual absl::Status GemmResume(bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, const float* a,
                                  int64_t lda, const float* b, int64_t ldb,
                                  float* c, int64_t ldc);

  // ---- Element-wise ----
  virtual absl::Status Fill(float* x, int64_t n, float value) = 0;
  // y = alpha * x + beta * y.
  virtual absl::Status Axpby(int64_t n, float alpha, const float* x, float beta,
                             float* y) = 0;
  // out = a + b (out may alias a or b).
  virtual absl::Status Add(int64_t n, const float* a, const float* b,
                           float* out) = 0;
  // x[r, c] += bias[c] for a [rows, cols] matrix.
  virtual absl::Status AddRowBroadcast(int64_t rows, int64_t cols,
                                       const float* bias, float* x) = 0;
  virtual absl::Status ReluForward(int64_t n, const float* x, float* y) = 0;
  // dx = dy where y > 0, else 0 (dx may alias dy).
  virtual absl::Status ReluBackward(int64_t n, const float* y, const float* dy,
                                    float* dx) = 0;
  virtual absl::Status GeluForward(int64_t n, const float* x, float* y) = 0;
  virtual absl::Status GeluBackward(int64_t n, const float* x, const float* dy,
                                    float* dx) = 0;
  // y = x * DropoutScale(seed, i, rate) elementwise (math::DropoutScale);
  // the same call on dy gives the backward pass.
  virtual absl::Status Dropout(int64_t n, const float* x, float rate,
                               uint64_t seed, float* y) = 0;

  // ---- Reductions ----
  // out[c] = beta * out[c] + sum_r x[r, c] for a [rows, cols] matrix.
  virtual absl::Status ColumnSum(int64_t rows, int64_t cols, const float* x,
                                 float beta, float* out) = 0;
  // Sum of squares of x, returned to the host (synchronizes).
  virtual absl::StatusOr<double> SumSquares(int64_t n, const float* x) = 0;

  // ---- Row-wise operations on [rows, cols] ----
  // Softmax of each row. With causal_t > 0, row r is a query at position
  // r % causal_t and columns > r % causal_t are masked out (probability 0).
  virtual absl::Status SoftmaxForward(int64_t rows, int64_t cols,
                                      int64_t causal_t, const float* x,
                                      float* y) = 0;
  // dx = y * (dy - sum(dy * y)) per row (dx may alias dy).
  virtual absl::Status SoftmaxBackward(int64_t rows, int64_t cols,
                                       const float* y, const float* dy,
                                       float* dx) = 0;
  // y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd
  // ([rows] each) for the backward pass.
  virtual absl::Status LayerNormForward(int64_t rows, int64_t cols,
                                        const float* x, const float* gamma,
                                        const float* beta, float eps, float* y,
                                        float* mean, float* rstd) = 0;
  // dx = gradient w.r.t. x; dgamma and dbeta are accumulated into (+=).
  virtual absl::Status LayerNormBackward(int64_t rows, int64_t cols,
                                         const float* x, const float* gamma,
                                         const float* mean, const float* rstd,
                                         const float* dy, float* dx,
                                         float* dgamma, float* dbeta) = 0;
  // Softmax cross-entropy of each row of `logits` against `labels` (class ids
  // as floats, [rows]). Writes the row probabilities, each row's loss
  // (-log p[label]) and 1/0 for whether the arg-max is the label. Fails with
  // InvalidArgument when a label is outside [0, cols).
  virtual absl::Status SoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                           const float* logits,
                                           const float* labels, float* probs,
                                           float* loss, float* correct) = 0;
  // dlogits = scale * (probs - onehot(labels)).
  virtual absl::Status SoftmaxCrossEntropyBackward(int64_t rows, int64_t cols,
                                                   const float* probs,
                                                   const float* labels,
                                                   float scale,
                                                   float* dlogits) = 0;

  // ---- Gather / scatter / layout ----
  // out[i, :] = table[ids[i], :] for i < n; ids are floats holding integers.
  // Fails with InvalidArgument when an id is outside [0, vocab).
  virtual absl::Status EmbeddingForward(int64_t n, int64_t dim, int64_t vocab,
                                        const float* ids, const float* table,
                                        float* out) = 0;
  // dtable[ids[i], :] += dy[i, :].
  virtual absl::Status EmbeddingBackward(int64_t n, int64_t dim,
                                         const float* ids, const float* dy,
                                         float* dtable) = 0;
  // out = permutation of a 4-D tensor `in` (see Permute4).
  virtual absl::Status Permute(const Permute4& p, const float* in,
                               float* out) = 0;

  // ---- Optimizer updates (math::SgdStep / math::AdamWStep per element) ----
  virtual absl::Status SgdUpdate(int64_t n, float* w, const float* g, float* m,
                                 float lr, float momentum, float weight_decay,
                                 float grad_scale) = 0;
  virtual absl::Status AdamWUpdate(int64_t n, float* w, const float* g,
                                   float* m, float* v, float lr, float beta1,
                                   float beta2, float eps, float weight_decay,
                                   float bias1, float bias2,
                                   float grad_scale) = 0;
};

// Which backend to create.
enum class BackendKind { kAuto = 0, kCpu = 1, kCuda = 2 };

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;
  // CPU: BLAS and element-wise threads (0: all cores). CUDA: ignored.
  int threads = 0;
  // CUDA: which device.
  int cuda_device = 0;
};

// Parses "auto", "cpu" or "cuda".
absl::StatusOr<BackendKind> ParseBackendKind(const std::string& name);

// kAuto picks CUDA when the CUDA backend was built and a device works, else
// the CPU; when CUDA was built but fails (no driver, a broken device) it
// logs the CUDA error as a warning before falling back. kCuda fails with
// FailedPrecondition when it cannot be had, with the CUDA error when the
// runtime gave one.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const BackendOptions& options);

// The CUDA devices this process can use: 0 when the runtime finds none;
// FailedPrecondition when this build has no CUDA backend; the CUDA error
// (call, file, line and the runtime's message) when the runtime cannot start
// (no driver, a driver too old, a device that fails to initialise).
absl::StatusOr<int> UsableCudaDevices();

// True when UsableCudaDevices() is at least 1.
bool CudaAvailable();

// Helpers that move whole tensors between the host and a backend.
absl::StatusOr<Tensor> ToDevice(Backend* backend, const Tensor& host);
absl::StatusOr<Tensor> ToHost(Backend* backend, const Tensor& device_tensor);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_BACKEND_H_
