// ForwardingBackend: a Backend that passes every call to another one, for
// tests that watch or alter a few calls (override those, call the base).
// Not thread-safe beyond what the inner backend is.
#ifndef PIPETRAIN_WORKER_COMPUTE_FORWARDING_BACKEND_H_
#define PIPETRAIN_WORKER_COMPUTE_FORWARDING_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "worker/compute/backend.h"

namespace pipetrain {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner)
      : inner_(std::move(inner)) {}

  Device device() const override { return inner_->device(); }
  std::string Describe() const override { return inner_->Describe(); }
  int64_t MemoryBytes() const override { return inner_->MemoryBytes(); }
  absl::StatusOr<Tensor> Allocate(const Shape& shape) override {
    return inner_->Allocate(shape);
  }
  absl::StatusOr<Tensor> AllocateUninitialized(const Shape& shape) override {
    return inner_->AllocateUninitialized(shape);
  }
  absl::Status CopyFromHost(const float* host, int64_t n, float* dst) override {
    return inner_->CopyFromHost(host, n, dst);
  }
  absl::Status CopyToHost(const float* src, int64_t n, float* host) override {
    return inner_->CopyToHost(src, n, host);
  }
  absl::Status Copy(const float* src, int64_t n, float* dst) override {
    return inner_->Copy(src, n, dst);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float beta, float* c, int64_t ldc) override {
    return inner_->Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                        c, ldc);
  }
  absl::Status GemmStridedBatched(bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha,
                                  const float* a, int64_t lda, int64_t stride_a,
                                  const float* b, int64_t ldb, int64_t stride_b,
                                  float beta, float* c, int64_t ldc,
                                  int64_t stride_c, int64_t batch) override {
    return inner_->GemmStridedBatched(trans_a, trans_b, m, n, k, alpha, a, lda,
                                      stride_a, b, ldb, stride_b, beta, c, ldc,
                                      stride_c, batch);
  }
  absl::StatusOr<bool> PackOperand(bool trans_b, int64_t k, int64_t n,
                                   const float* b, int64_t ldb,
                                   PackedOperand* packed) override {
    return inner_->PackOperand(trans_b, k, n, b, ldb, packed);
  }
  absl::Status GemmPacked(int64_t m, const float* a, int64_t lda,
                          const PackedOperand& packed, float* c,
                          int64_t ldc) override {
    return inner_->GemmPacked(m, a, lda, packed, c, ldc);
  }
  bool ResumesSums(bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t max_k) const override {
    return inner_->ResumesSums(trans_a, trans_b, m, n, max_k);
  }
  absl::Status GemmResume(bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c,
                          int64_t ldc) override {
    return inner_->GemmResume(trans_a, trans_b, m, n, k, a, lda, b, ldb, c,
                              ldc);
  }
  absl::Status Fill(float* x, int64_t n, float value) override {
    return inner_->Fill(x, n, value);
  }
  absl::Status Axpby(int64_t n, float alpha, const float* x, float beta,
                     float* y) override {
    return inner_->Axpby(n, alpha, x, beta, y);
  }
  absl::Status Add(int64_t n, const float* a, const float* b,
                   float* out) override {
    return inner_->Add(n, a, b, out);
  }
  absl::Status AddRowBroadcast(int64_t rows, int64_t cols, const float* bias,
                               float* x) override {
    return inner_->AddRowBroadcast(rows, cols, bias, x);
  }
  absl::Status ReluForward(int64_t n, const float* x, float* y) override {
    return inner_->ReluForward(n, x, y);
  }
  absl::Status ReluBackward(int64_t n, const float* y, const float* dy,
                            float* dx) override {
    return inner_->ReluBackward(n, y, dy, dx);
  }
  absl::Status GeluForward(int64_t n, const float* x, float* y) override {
    return inner_->GeluForward(n, x, y);
  }
  absl::Status GeluBackward(int64_t n, const float* x, const float* dy,
                            float* dx) override {
    return inner_->GeluBackward(n, x, dy, dx);
  }
  absl::Status Dropout(int64_t n, const float* x, float rate, uint64_t seed,
                       float* y) override {
    return inner_->Dropout(n, x, rate, seed, y);
  }
  absl::Status ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                         float* out) override {
    return inner_->ColumnSum(rows, cols, x, beta, out);
  }
  absl::StatusOr<double> SumSquares(int64_t n, const float* x) override {
    return inner_->SumSquares(n, x);
  }
  absl::Status SoftmaxForward(int64_t rows, int64_t cols, int64_t causal_t,
                              const float* x, float* y) override {
    return inner_->SoftmaxForward(rows, cols, causal_t, x, y);
  }
  absl::Status SoftmaxBackward(int64_t rows, int64_t cols, const float* y,
                               const float* dy, float* dx) override {
    return inner_->SoftmaxBackward(rows, cols, y, dy, dx);
  }
  absl::Status LayerNormForward(int64_t rows, int64_t cols, const float* x,
                                const float* gamma, const float* beta,
                                float eps, float* y, float* mean,
                                float* rstd) override {
    return inner_->LayerNormForward(rows, cols, x, gamma, beta, eps, y, mean,
                                    rstd);
  }
  absl::Status LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                                 const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx,
                                 float* dgamma, float* dbeta) override {
    return inner_->LayerNormBackward(rows, cols, x, gamma, mean, rstd, dy, dx,
                                     dgamma, dbeta);
  }
  absl::Status SoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                   const float* logits, const float* labels,
                                   float* probs, float* loss,
                                   float* correct) override {
    return inner_->SoftmaxCrossEntropy(rows, cols, logits, labels, probs, loss,
                                       correct);
  }
  absl::Status SoftmaxCrossEntropyBackward(int64_t rows, int64_t cols,
                                           const float* probs,
                                           const float* labels, float scale,
                                           float* dlogits) override {
    return inner_->SoftmaxCrossEntropyBackward(rows, cols, probs, labels, scale,
                                               dlogits);
  }
  absl::Status EmbeddingForward(int64_t n, int64_t dim, int64_t vocab,
                                const float* ids, const float* table,
                                float* out) override {
    return inner_->EmbeddingForward(n, dim, vocab, ids, table, out);
  }
  absl::Status EmbeddingBackward(int64_t n, int64_t dim, const float* ids,
                                 const float* dy, float* dtable) override {
    return inner_->EmbeddingBackward(n, dim, ids, dy, dtable);
  }
  absl::Status Permute(const Permute4& p, const float* in,
                       float* out) override {
    return inner_->Permute(p, in, out);
  }
  absl::Status SgdUpdate(int64_t n, float* w, const float* g, float* m,
                         float lr, float momentum, float weight_decay,
                         float grad_scale) override {
    return inner_->SgdUpdate(n, w, g, m, lr, momentum, weight_decay,
                             grad_scale);
  }
  absl::Status AdamWUpdate(int64_t n, float* w, const float* g, float* m,
                           float* v, float lr, float beta1, float beta2,
                           float eps, float weight_decay, float bias1,
                           float bias2, float grad_scale) override {
    return inner_->AdamWUpdate(n, w, g, m, v, lr, beta1, beta2, eps,
                               weight_decay, bias1, bias2, grad_scale);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_FORWARDING_BACKEND_H_
