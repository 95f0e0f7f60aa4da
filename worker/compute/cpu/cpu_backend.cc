#include "worker/compute/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/cpu/blas_kernels.h"
#include "worker/compute/cpu/cpu_gemm.h"
#include "worker/compute/cpu/elementwise_kernels.h"
#include "worker/compute/cpu/host_block_cache.h"
#include "worker/compute/cpu/optimizer_kernels.h"
#include "worker/compute/cpu/parallel_for.h"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace {

// Below this many elements per thread a loop runs on fewer threads: waking
// a worker costs more.
constexpr int64_t kParallelGrain = 1 << 15;

// Items (rows) per chunk so that a chunk has about `grain` elements when an
// item has `item_size` of them.
int64_t PerItemGrain(int64_t grain, int64_t item_size) {
  return std::max<int64_t>(1, grain / std::max<int64_t>(1, item_size));
}

absl::Status BadLabel(int64_t row, float label, int64_t classes) {
  return absl::InvalidArgumentError(absl::StrCat(
      "label ", label, " of row ", row, " is outside [0, ", classes, ")"));
}

// The most freed tensor memory a CPU backend keeps for reuse
// (HostBlockCache): many times a micro-batch's tensors on the models this
// project trains on a CPU, a small share of a worker's memory.
constexpr size_t kMaxKeptBytes = size_t{512} << 20;

// Memory comes from the backend's HostBlockCache (64-byte aligned for vector
// loads). A shape whose size overflows, or memory the system will not give,
// is ResourceExhausted: a job too large for this worker fails its call, and
// the worker lives on.
absl::StatusOr<Tensor> HostTensor(const std::shared_ptr<HostBlockCache>& cache,
                                  const Shape& shape, bool zero) {
  const std::optional<int64_t> n = CheckedNumElements(shape);
  const std::optional<int64_t> bytes =
      n.has_value() ? CheckedMul(*n, sizeof(float)) : std::nullopt;
  if (!bytes.has_value() || *bytes > (int64_t{1} << 62)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a tensor of shape ", ShapeToString(shape)));
  }
  const size_t size = static_cast<size_t>(*bytes);
  void* data = cache->Take(size);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", *bytes,
                     " bytes for a tensor of shape ", ShapeToString(shape)));
  }
  if (zero) std::memset(data, 0, HostBlockCache::RoundedSize(size));
  return Tensor(std::make_shared<Storage>(
                    data, size, Device::kCpu,
                    [cache](void* p, size_t b) { cache->Give(p, b); }),
                shape);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads), pool_(threads), gemm_(&pool_) {
    openblas_set_num_threads(threads_);
  }

  Device device() const override { return Device::kCpu; }
  std::string Describe() const override {
    return absl::StrCat("cpu (", DescribeCpuKernels(gemm_.packs()), ", ",
                        threads_, " threads)");
  }

  absl::StatusOr<Tensor> Allocate(const Shape& shape) override {
    return HostTensor(cache_, shape, /*zero=*/true);
  }
  absl::StatusOr<Tensor> AllocateUninitialized(const Shape& shape) override {
    return HostTensor(cache_, shape, /*zero=*/false);
  }
  absl::Status CopyFromHost(const float* host, int64_t n, float* dst) override {
    return Copy(host, n, dst);
  }
  absl::Status CopyToHost(const float* src, int64_t n, float* host) override {
    return Copy(src, n, host);
  }
  absl::Status Copy(const float* src, int64_t n, float* dst) override {
    if (n > 0 && src != dst) std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float beta, float* c, int64_t ldc) override {
    return gemm_.Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                      ldc);
  }
  absl::StatusOr<bool> PackOperand(bool trans_b, int64_t k, int64_t n,
                                   const float* b, int64_t ldb,
                                   PackedOperand* packed) override {
    return gemm_.PackOperand(trans_b, k, n, b, ldb, packed);
  }
  absl::Status GemmPacked(int64_t m, const float* a, int64_t lda,
                          const PackedOperand& packed, float* c,
                          int64_t ldc) override {
    return gemm_.GemmPacked(m, a, lda, packed, c, ldc);
  }
  bool ResumesSums(bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t max_k) const override {
    return gemm_.ResumesSums(trans_a, trans_b, m, n, max_k);
  }
  absl::Status GemmResume(bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c,
                          int64_t ldc) override {
    return gemm_.GemmResume(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  }
  absl::Status GemmStridedBatched(bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha,
                                  const float* a, int64_t lda, int64_t stride_a,
                                  const float* b, int64_t ldb, int64_t stride_b,
                                  float beta, float* c, int64_t ldc,
                                  int64_t stride_c, int64_t batch) override {
    return gemm_.GemmStridedBatched(trans_a, trans_b, m, n, k, alpha, a, lda,
                                    stride_a, b, ldb, stride_b, beta, c, ldc,
                                    stride_c, batch);
  }
  absl::Status Fill(float* x, int64_t n, float value) override {
    pool_.Run(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        x[i] = value;
      }
    });
    return absl::OkStatus();
  }

  absl::Status Axpby(int64_t n, float alpha, const float* x, float beta,
                     float* y) override {
    pool_.Run(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        y[i] = alpha * x[i] + beta * y[i];
      }
    });
    return absl::OkStatus();
  }

  absl::Status Add(int64_t n, const float* a, const float* b,
                   float* out) override {
    pool_.Run(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        out[i] = a[i] + b[i];
      }
    });
    return absl::OkStatus();
  }

  absl::Status AddRowBroadcast(int64_t rows, int64_t cols, const float* bias,
                               float* x) override {
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  float* row = x + r * cols;
                  for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
                }
              });
    return absl::OkStatus();
  }

  absl::Status ReluForward(int64_t n, const float* x, float* y) override {
    pool_.Run(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        y[i] = math::Relu(x[i]);
      }
    });
    return absl::OkStatus();
  }

  absl::Status ReluBackward(int64_t n, const float* y, const float* dy,
                            float* dx) override {
    pool_.Run(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        dx[i] = math::ReluGrad(y[i], dy[i]);
      }
    });
    return absl::OkStatus();
  }

  absl::Status GeluForward(int64_t n, const float* x, float* y) override {
    pool_.Run(n, kParallelGrain / 8, [&](int64_t begin, int64_t end) {
      cpu_kernels::GeluForwardRange(begin, end, x, y);
    });
    return absl::OkStatus();
  }

  absl::Status GeluBackward(int64_t n, const float* x, const float* dy,
                            float* dx) override {
    pool_.Run(n, kParallelGrain / 8, [&](int64_t begin, int64_t end) {
      cpu_kernels::GeluBackwardRange(begin, end, x, dy, dx);
    });
    return absl::OkStatus();
  }

  absl::Status Dropout(int64_t n, const float* x, float rate, uint64_t seed,
                       float* y) override {
    pool_.Run(n, kParallelGrain / 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        y[i] = x[i] * math::DropoutScale(seed, static_cast<uint64_t>(i), rate);
      }
    });
    return absl::OkStatus();
  }

  absl::Status ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                         float* out) override {
    // Parallel over column blocks; each thread sums its columns row by row
    // (unit stride inner loop).
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (cols + kBlock - 1) / kBlock;
    pool_.Run(blocks,
              PerItemGrain(kParallelGrain,
                           rows * cols / std::max<int64_t>(1, blocks)),
              [&](int64_t begin, int64_t end) {
                for (int64_t blk = begin; blk < end; ++blk) {
                  const int64_t c0 = blk * kBlock;
                  const int64_t c1 = std::min(cols, c0 + kBlock);
                  float acc[kBlock];
                  for (int64_t c = c0; c < c1; ++c) acc[c - c0] = 0.0f;
                  for (int64_t r = 0; r < rows; ++r) {
                    const float* row = x + r * cols;
                    for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
                  }
                  for (int64_t c = c0; c < c1; ++c) {
                    out[c] =
                        (beta == 0.0f ? 0.0f : beta * out[c]) + acc[c - c0];
                  }
                }
              });
    return absl::OkStatus();
  }

  absl::StatusOr<double> SumSquares(int64_t n, const float* x) override {
    // One partial sum per chunk, added in chunk order: deterministic.
    std::vector<double> partial(pool_.threads(), 0.0);
    const int64_t per = (n + pool_.threads() - 1) / pool_.threads();
    pool_.Run(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      double s = 0.0;
      for (int64_t i = begin; i < end; ++i)
        s += static_cast<double>(x[i]) * x[i];
      partial[per == 0 ? 0 : begin / per] = s;
    });
    double total = 0.0;
    for (double s : partial) total += s;
    return total;
  }

  absl::Status SoftmaxForward(int64_t rows, int64_t cols, int64_t causal_t,
                              const float* x, float* y) override {
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  const float* in = x + r * cols;
                  float* out = y + r * cols;
                  const int64_t valid =
                      causal_t > 0 ? std::min(cols, (r % causal_t) + 1) : cols;
                  float max_v = -std::numeric_limits<float>::infinity();
                  for (int64_t c = 0; c < valid; ++c)
                    max_v = std::max(max_v, in[c]);
                  cpu_kernels::ExpShifted(valid, in, max_v, out);
                  float sum = 0.0f;
                  for (int64_t c = 0; c < valid; ++c) sum += out[c];
                  const float inv = 1.0f / sum;
                  for (int64_t c = 0; c < valid; ++c) out[c] *= inv;
                  for (int64_t c = valid; c < cols; ++c) out[c] = 0.0f;
                }
              });
    return absl::OkStatus();
  }

  absl::Status SoftmaxBackward(int64_t rows, int64_t cols, const float* y,
                               const float* dy, float* dx) override {
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  const float* yr = y + r * cols;
                  const float* dyr = dy + r * cols;
                  float* dxr = dx + r * cols;
                  float dot = 0.0f;
                  for (int64_t c = 0; c < cols; ++c) dot += yr[c] * dyr[c];
                  for (int64_t c = 0; c < cols; ++c)
                    dxr[c] = yr[c] * (dyr[c] - dot);
                }
              });
    return absl::OkStatus();
  }

  absl::Status LayerNormForward(int64_t rows, int64_t cols, const float* x,
                                const float* gamma, const float* beta,
                                float eps, float* y, float* mean,
                                float* rstd) override {
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  const float* xr = x + r * cols;
                  float* yr = y + r * cols;
                  double sum = 0.0;
                  for (int64_t c = 0; c < cols; ++c) sum += xr[c];
                  const float mu = static_cast<float>(sum / cols);
                  double var = 0.0;
                  for (int64_t c = 0; c < cols; ++c) {
                    const double d = xr[c] - mu;
                    var += d * d;
                  }
                  const float rs =
                      1.0f / std::sqrt(static_cast<float>(var / cols) + eps);
                  for (int64_t c = 0; c < cols; ++c) {
                    yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
                  }
                  mean[r] = mu;
                  rstd[r] = rs;
                }
              });
    return absl::OkStatus();
  }

  absl::Status LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                                 const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx,
                                 float* dgamma, float* dbeta) override {
    // dgamma/dbeta are column reductions; done serially over rows to keep
    // the summation order fixed, then dx in parallel.
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        dgamma[c] += dyr[c] * (xr[c] - mean[r]) * rstd[r];
        dbeta[c] += dyr[c];
      }
    }
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  const float* xr = x + r * cols;
                  const float* dyr = dy + r * cols;
                  float* dxr = dx + r * cols;
                  float sum_g = 0.0f;
                  float sum_gx = 0.0f;
                  for (int64_t c = 0; c < cols; ++c) {
                    const float g = dyr[c] * gamma[c];
                    const float xhat = (xr[c] - mean[r]) * rstd[r];
                    sum_g += g;
                    sum_gx += g * xhat;
                  }
                  const float inv_n = 1.0f / cols;
                  for (int64_t c = 0; c < cols; ++c) {
                    const float g = dyr[c] * gamma[c];
                    const float xhat = (xr[c] - mean[r]) * rstd[r];
                    dxr[c] =
                        rstd[r] * (g - inv_n * sum_g - xhat * inv_n * sum_gx);
                  }
                }
              });
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                   const float* logits, const float* labels,
                                   float* probs, float* loss,
                                   float* correct) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float label = labels[r];
      if (!(label >= 0.0f && label < static_cast<float>(cols)) ||
          label != std::floor(label)) {
        return BadLabel(r, label, cols);
      }
    }
    RETURN_IF_ERROR(SoftmaxForward(rows, cols, 0, logits, probs));
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  const float* p = probs + r * cols;
                  const float* z = logits + r * cols;
                  const int64_t label = static_cast<int64_t>(labels[r]);
                  int64_t arg = 0;
                  for (int64_t c = 1; c < cols; ++c) {
                    if (z[c] > z[arg]) arg = c;
                  }
                  loss[r] = -std::log(std::max(p[label], 1e-30f));
                  correct[r] = arg == label ? 1.0f : 0.0f;
                }
              });
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropyBackward(int64_t rows, int64_t cols,
                                           const float* probs,
                                           const float* labels, float scale,
                                           float* dlogits) override {
    pool_.Run(rows, PerItemGrain(kParallelGrain, cols),
              [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                  const float* p = probs + r * cols;
                  float* d = dlogits + r * cols;
                  const int64_t label = static_cast<int64_t>(labels[r]);
                  for (int64_t c = 0; c < cols; ++c) {
                    d[c] = scale * (p[c] - (c == label ? 1.0f : 0.0f));
                  }
                }
              });
    return absl::OkStatus();
  }

  absl::Status EmbeddingForward(int64_t n, int64_t dim, int64_t vocab,
                                const float* ids, const float* table,
                                float* out) override {
    for (int64_t i = 0; i < n; ++i) {
      const float id = ids[i];
      if (!(id >= 0.0f && id < static_cast<float>(vocab)) ||
          id != std::floor(id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " at position ", i,
                         " is outside [0, ", vocab, ")"));
      }
    }
    pool_.Run(n, PerItemGrain(kParallelGrain, dim),
              [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) {
                  std::memcpy(out + i * dim,
                              table + static_cast<int64_t>(ids[i]) * dim,
                              dim * sizeof(float));
                }
              });
    return absl::OkStatus();
  }

  absl::Status EmbeddingBackward(int64_t n, int64_t dim, const float* ids,
                                 const float* dy, float* dtable) override {
    for (int64_t i = 0; i < n; ++i) {
      float* row = dtable + static_cast<int64_t>(ids[i]) * dim;
      const float* g = dy + i * dim;
      for (int64_t c = 0; c < dim; ++c) row[c] += g[c];
    }
    return absl::OkStatus();
  }

  absl::Status Permute(const Permute4& p, const float* in,
                       float* out) override {
    int64_t in_stride[4];
    in_stride[3] = 1;
    for (int d = 2; d >= 0; --d)
      in_stride[d] = in_stride[d + 1] * p.dims[d + 1];
    int64_t od[4];
    int64_t os[4];  // input stride of each output dimension
    for (int k = 0; k < 4; ++k) {
      od[k] = p.dims[p.perm[k]];
      os[k] = in_stride[p.perm[k]];
    }
    const int64_t outer = od[0] * od[1];
    pool_.Run(outer,
              std::max<int64_t>(
                  1, kParallelGrain / std::max<int64_t>(1, od[2] * od[3])),
              [&](int64_t begin, int64_t end) {
                for (int64_t o = begin; o < end; ++o) {
                  const int64_t i0 = o / od[1];
                  const int64_t i1 = o % od[1];
                  float* dst = out + o * od[2] * od[3];
                  const float* src = in + i0 * os[0] + i1 * os[1];
                  for (int64_t i2 = 0; i2 < od[2]; ++i2) {
                    const float* s2 = src + i2 * os[2];
                    float* d2 = dst + i2 * od[3];
                    for (int64_t i3 = 0; i3 < od[3]; ++i3)
                      d2[i3] = s2[i3 * os[3]];
                  }
                }
              });
    return absl::OkStatus();
  }

  absl::Status SgdUpdate(int64_t n, float* w, const float* g, float* m,
                         float lr, float momentum, float weight_decay,
                         float grad_scale) override {
    pool_.Run(n, kParallelGrain, [=](int64_t begin, int64_t end) {
      cpu_kernels::SgdRange(begin, end, w, g, m, lr, momentum, weight_decay,
                            grad_scale);
    });
    return absl::OkStatus();
  }

  absl::Status AdamWUpdate(int64_t n, float* w, const float* g, float* m,
                           float* v, float lr, float beta1, float beta2,
                           float eps, float weight_decay, float bias1,
                           float bias2, float grad_scale) override {
    pool_.Run(n, kParallelGrain, [=](int64_t begin, int64_t end) {
      cpu_kernels::AdamWRange(begin, end, w, g, m, v, lr, beta1, beta2, eps,
                              weight_decay, bias1, bias2, grad_scale);
    });
    return absl::OkStatus();
  }

 private:
  const int threads_;
  ParallelFor pool_;
  CpuGemm gemm_;  // runs on pool_
  // Shared with the tensors' deleters: a tensor may outlive the backend.
  const std::shared_ptr<HostBlockCache> cache_ =
      std::make_shared<HostBlockCache>(kMaxKeptBytes);
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int threads) {
  if (threads <= 0) {
    threads = std::max(1u, std::thread::hardware_concurrency());
  }
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace pipetrain
