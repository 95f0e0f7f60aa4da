// bench_compute: one training step of the MLP 784-2048-2048-2048-10 (batch
// 256, forward + backward + SGD) on the CPU backend, beside raw OpenBLAS
// sgemm running the same matrix products at the same thread count, measured
// in the same run. The ratio shows what the framework costs over the GEMMs.
// Then the products of one 2048x2048 Linear at a micro-batch's 32 rows and
// at the batch's 256, one thread, through the backend and raw sgemm: what
// cutting the batch into micro-batches costs a pipeline stage per FLOP.
//
// Last line: {"bench":"compute", ..., "ratio_vs_sgemm": ...,
// "micro_batch_vs_batch_<forward|input_grad|weight_grad>": ...,
// "micro_batch_packed_vs_batch_<forward|input_grad>": ...,
// "pack_<forward|transposed>_vs_portable": ...}.
//
// And laying one 2048x2048 weight out for the packed kernel
// (packed_gemm::Pack, vectorised where the CPU has AVX2) against the
// portable form a float at a time (PackPortable), both layouts, in
// interleaved rounds: pack_*_vs_portable is the portable form's median
// time over the vectorised one's (> 1: faster).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_models.h"
#include "common/median.h"
#include "common/status_macros.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/cpu/packed_gemm.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/loss.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"

namespace pipetrain {
namespace {

constexpr int64_t kBatch = 256;
const std::vector<int64_t> kWidths = {784, 2048, 2048, 2048, 10};

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

v1::ModelSpec MlpSpec() { return WideMlpModel(); }

// Useful FLOPs of one step: forward and weight gradients for every layer,
// input gradients for all but the first.
double StepFlops() {
  double f = 0;
  for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
    const double mn = 2.0 * kBatch * kWidths[i] * kWidths[i + 1];
    f += (i == 0 ? 2 : 3) * mn;
  }
  return f;
}

// The same GEMMs a training step issues, straight to OpenBLAS.
class RawGemms {
 public:
  RawGemms() {
    for (size_t i = 0; i < kWidths.size(); ++i) {
      acts_.emplace_back(kBatch * kWidths[i], 0.01f);
      grads_.emplace_back(kBatch * kWidths[i], 0.01f);
    }
    for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
      weights_.emplace_back(kWidths[i] * kWidths[i + 1], 0.01f);
      wgrads_.emplace_back(kWidths[i] * kWidths[i + 1], 0.0f);
    }
  }
  void Step() {
    const size_t n = weights_.size();
    for (size_t i = 0; i < n; ++i) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kBatch,
                  kWidths[i + 1], kWidths[i], 1.0f, acts_[i].data(), kWidths[i],
                  weights_[i].data(), kWidths[i + 1], 0.0f, acts_[i + 1].data(),
                  kWidths[i + 1]);
    }
    for (size_t i = n; i-- > 0;) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kWidths[i],
                  kWidths[i + 1], kBatch, 1.0f, acts_[i].data(), kWidths[i],
                  grads_[i + 1].data(), kWidths[i + 1], 0.0f, wgrads_[i].data(),
                  kWidths[i + 1]);
      if (i > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kBatch, kWidths[i],
                    kWidths[i + 1], 1.0f, grads_[i + 1].data(), kWidths[i + 1],
                    weights_[i].data(), kWidths[i + 1], 0.0f, grads_[i].data(),
                    kWidths[i]);
      }
    }
  }

 private:
  std::vector<std::vector<float>> acts_, grads_, weights_, wgrads_;
};

struct Trainer {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<SoftmaxCrossEntropyLoss> loss;
  Tensor x, labels;

  absl::Status Step() {
    ZeroGrads(model->params());
    ForwardOptions options;
    std::vector<LayerContext> contexts;
    ASSIGN_OR_RETURN(Tensor logits, model->Forward(x, options, &contexts));
    LayerContext loss_ctx;
    RETURN_IF_ERROR(loss->Forward(logits, labels, &loss_ctx).status());
    ASSIGN_OR_RETURN(Tensor dlogits, loss->Backward(1.0f / kBatch, &loss_ctx));
    RETURN_IF_ERROR(
        model->Backward(dlogits, options, &contexts, false).status());
    return optimizer->Step(model->params());
  }
};

absl::StatusOr<Trainer> MakeTrainer(int threads) {
  Trainer t;
  t.backend = CreateCpuBackend(threads);
  ASSIGN_OR_RETURN(t.model, Model::Build(MlpSpec(), 0, MlpSpec().layers_size(),
                                         t.backend.get(), 1));
  v1::OptimizerSpec opt;
  opt.mutable_sgd()->set_lr(0.01f);
  opt.mutable_sgd()->set_momentum(0.9f);
  ASSIGN_OR_RETURN(t.optimizer, Optimizer::Create(opt, t.backend.get()));
  t.loss = std::make_unique<SoftmaxCrossEntropyLoss>(t.backend.get());
  Tensor x = Tensor::Host({kBatch, kWidths[0]});
  Tensor labels = Tensor::Host({kBatch});
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = math::UniformAt(3, i);
  for (int64_t i = 0; i < kBatch; ++i) labels.f32()[i] = i % 10;
  ASSIGN_OR_RETURN(t.x, ToDevice(t.backend.get(), x));
  ASSIGN_OR_RETURN(t.labels, ToDevice(t.backend.get(), labels));
  return t;
}

// The three products of one 2048x2048 Linear layer at `rows` rows, as
// the layer issues them (linear.cc: weight [in, out]): forward y = x W,
// input gradient dx = dy W^T, weight gradient dW += x^T dy.
struct LayerGemms {
  static constexpr int64_t kSide = 2048;
  std::vector<float> x, dy, y, dx, w, dw;
  LayerGemms()
      : x(kBatch * kSide, 0.01f),
        dy(kBatch * kSide, 0.02f),
        y(kBatch * kSide),
        dx(kBatch * kSide),
        w(kSide * kSide, 0.01f),
        dw(kSide * kSide, 0.0f) {}
  // The forward (op 0) or input-gradient (op 1) products of a batch's
  // rows, `rows` at a time, through a packed weight (Backend::PackOperand)
  // made once for them all, as a stage reusing its weights does each step.
  void RunPacked(Backend* backend, int op, int64_t rows) {
    const int64_t s = kSide;
    (void)backend->PackOperand(op == 1, s, s, w.data(), s, &packed);
    const float* a = op == 0 ? x.data() : dy.data();
    float* c = op == 0 ? y.data() : dx.data();
    for (int64_t r = 0; r < kBatch; r += rows) {
      (void)backend->GemmPacked(rows, a + r * s, s, packed, c + r * s, s);
    }
  }
  PackedOperand packed;

  // op 0: forward, 1: input gradient, 2: weight gradient.
  void Run(Backend* backend, bool raw, int op, int64_t rows) {
    const int64_t s = kSide;
    if (op == 0) {
      Gemm(backend, raw, false, false, rows, s, s, x.data(), w.data(), 0.0f,
           y.data());
    } else if (op == 1) {
      Gemm(backend, raw, false, true, rows, s, s, dy.data(), w.data(), 0.0f,
           dx.data());
    } else {
      Gemm(backend, raw, true, false, s, s, rows, x.data(), dy.data(), 1.0f,
           dw.data());
    }
  }

 private:
  // C = op(A) op(B) + beta C on s-wide row-major matrices, through the
  // backend or straight to OpenBLAS (`raw`).
  static void Gemm(Backend* backend, bool raw, bool ta, bool tb, int64_t m,
                   int64_t n, int64_t k, const float* a, const float* b,
                   float beta, float* c) {
    const int64_t s = kSide;
    if (raw) {
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                  tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, s, b, s,
                  beta, c, s);
    } else {
      (void)backend->Gemm(ta, tb, m, n, k, 1.0f, a, s, b, s, beta, c, s);
    }
  }
};

// Best-of-rounds seconds per call of `fn`.
template <typename Fn>
double SecondsPerCall(Fn fn, int iters) {
  const double start = Now();
  for (int i = 0; i < iters; ++i) fn();
  return (Now() - start) / iters;
}

// A pipeline stage runs each layer's products on micro-batches: batch 256
// in M = 8 is 32 rows a product, against 256 for a trainer on the whole
// batch. GFLOP/s at both sizes, one thread, through the backend (as the
// layers call it) and straight to OpenBLAS, in interleaved rounds (best
// of 5); and the forward and input-gradient products through a weight
// packed once for the 8 micro-batches (Backend::PackOperand, the pack
// counted), as a stage reusing its weights runs them. Returns the JSON
// fields: the backend's 32-row speed as a fraction of its 256-row speed
// per product, and the packed 32-row speed as a fraction of the backend's
// 256-row speed.
std::string MicroBatchGemms() {
  constexpr int64_t kMicroRows = kBatch / 8;
  const char* kOps[] = {"forward", "input_grad", "weight_grad"};
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  LayerGemms gemms;
  PackedOperand probe;
  const bool packs =
      backend->PackOperand(false, 1, 1, gemms.w.data(), 1, &probe)
          .value_or(false);
  // op; how (0: backend Gemm, 1: raw sgemm, 2: packed); rows == kBatch.
  double best[3][3][2] = {};
  for (int round = 0; round < 5; ++round) {
    for (int op = 0; op < 3; ++op) {
      for (int how = 0; how < 3; ++how) {
        if (how == 2 && (op == 2 || !packs)) continue;
        for (int whole = 0; whole < 2; ++whole) {
          const int64_t rows = whole ? kBatch : kMicroRows;
          // The same FLOPs at both sizes: the batch's worth of products.
          const int calls = static_cast<int>(kBatch / rows);
          const double seconds = SecondsPerCall(
              [&] {
                if (how == 2) return gemms.RunPacked(backend.get(), op, rows);
                for (int c = 0; c < calls; ++c) {
                  gemms.Run(backend.get(), how == 1, op, rows);
                }
              },
              2);
          const double gflops = 2.0 * kBatch * LayerGemms::kSide *
                                LayerGemms::kSide / seconds / 1e9;
          best[op][how][whole] = std::max(best[op][how][whole], gflops);
        }
      }
    }
  }
  std::printf(
      "one 2048x2048 Linear, one thread, GFLOP/s at %lld rows (a micro-batch "
      "of batch %lld in 8) and at %lld rows:\n",
      static_cast<long long>(kMicroRows), static_cast<long long>(kBatch),
      static_cast<long long>(kBatch));
  std::string json;
  for (int op = 0; op < 3; ++op) {
    const double ratio = best[op][0][0] / best[op][0][1];
    std::printf(
        "  %-11s backend %.1f vs %.1f (%.2f); sgemm %.1f vs %.1f (%.2f)\n",
        kOps[op], best[op][0][0], best[op][0][1], ratio, best[op][1][0],
        best[op][1][1], best[op][1][0] / best[op][1][1]);
    json +=
        absl::StrFormat(",\"micro_batch_vs_batch_%s\":%.3f", kOps[op], ratio);
    if (best[op][2][0] > 0) {
      // A stage's micro-batch products, weight packed once for the batch,
      // against the backend's Gemm on the whole batch (a trainer's).
      const double packed = best[op][2][0] / best[op][0][1];
      std::printf(
          "  %-11s packed once, %.1f at %lld rows (%.2f of the backend at "
          "%lld rows)\n",
          kOps[op], best[op][2][0], static_cast<long long>(kMicroRows), packed,
          static_cast<long long>(kBatch));
      json += absl::StrFormat(",\"micro_batch_packed_vs_batch_%s\":%.3f",
                              kOps[op], packed);
    }
  }
  return json;
}

// Pack against PackPortable on one 2048 x 2048 weight, W (forward) and
// W^T (input gradient) layouts; 9 interleaved rounds, medians.
std::string PackSpeed() {
  constexpr int64_t kSide = LayerGemms::kSide;
  std::vector<float> w(kSide * kSide),
      out(packed_gemm::PackedSize(kSide, kSide));
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = 0.001f * static_cast<float>(i % 997);
  const int64_t panels = packed_gemm::PanelCount(kSide);
  std::string json;
  std::printf(
      "laying a 2048x2048 weight out for the packed kernel, one thread "
      "(median of 9):\n");
  for (const bool trans : {false, true}) {
    std::vector<double> fast, portable;
    for (int round = 0; round < 9; ++round) {
      fast.push_back(SecondsPerCall(
          [&] {
            packed_gemm::Pack(trans, kSide, kSide, w.data(), kSide, 0, panels,
                              out.data());
          },
          3));
      portable.push_back(SecondsPerCall(
          [&] {
            packed_gemm::PackPortable(trans, kSide, kSide, w.data(), kSide, 0,
                                      panels, out.data());
          },
          3));
    }
    const double f = Median(fast), p = Median(portable);
    const char* name = trans ? "transposed" : "forward";
    std::printf("  %-10s Pack %.2f ms, portable %.2f ms (%.2fx)\n", name,
                f * 1e3, p * 1e3, p / f);
    json += absl::StrFormat(",\"pack_%s_vs_portable\":%.3f", name, p / f);
  }
  return json;
}

int Main() {
  const double flops = StepFlops();
  std::printf("MLP 784-2048-2048-2048-10, batch %lld: %.2f GFLOP per step\n",
              static_cast<long long>(kBatch), flops / 1e9);
  double worst_ratio = 1e9;
  std::string json = "{\"bench\":\"compute\"";
  for (int threads : {1, 2}) {
    auto trainer = MakeTrainer(threads);
    if (!trainer.ok()) {
      std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
      return 1;
    }
    RawGemms raw;
    absl::Status status;
    auto step = [&] {
      if (status.ok()) status = trainer->Step();
    };
    step();  // warm-up: first-touch of buffers
    raw.Step();
    const int iters = threads == 1 ? 4 : 6;
    double best_step = 1e9, best_gemm = 1e9;
    for (int round = 0; round < 3; ++round) {  // interleaved rounds
      best_gemm =
          std::min(best_gemm, SecondsPerCall([&] { raw.Step(); }, iters));
      best_step = std::min(best_step, SecondsPerCall(step, iters));
    }
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
    const double step_gflops = flops / best_step / 1e9;
    const double gemm_gflops = flops / best_gemm / 1e9;
    const double ratio = step_gflops / gemm_gflops;
    worst_ratio = std::min(worst_ratio, ratio);
    std::printf(
        "threads %d: train step %.1f ms = %.0f samples/s, %.1f GFLOP/s; "
        "sgemm alone %.1f GFLOP/s; ratio %.3f\n",
        threads, best_step * 1e3, kBatch / best_step, step_gflops, gemm_gflops,
        ratio);
    json += absl::StrFormat(
        ",\"threads%d_samples_per_s\":%.1f,\"threads%d_gflops\":%.2f,"
        "\"threads%d_sgemm_gflops\":%.2f,\"threads%d_ratio\":%.3f",
        threads, kBatch / best_step, threads, step_gflops, threads, gemm_gflops,
        threads, ratio);
  }
  json += absl::StrFormat(",\"ratio_vs_sgemm\":%.3f", worst_ratio);
  json += MicroBatchGemms();
  json += PackSpeed();
  json += "}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
