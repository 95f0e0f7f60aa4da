#include "worker/pipeline/profiler.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/elapsed.h"
#include "common/status_macros.h"
#include "spec/model_spec.h"
#include "spec/size_limits.h"
#include "worker/compute/elementwise_math.h"
#include "worker/nn/loss.h"
#include "worker/nn/model.h"
#include "worker/nn/optimizer.h"
#include "worker/nn/weight_grad_queue.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxProfileRepetitions = 100;

// The median of the runs, or with `fastest` the fastest.
double Summary(std::vector<double> v, bool fastest) {
  std::sort(v.begin(), v.end());
  return fastest ? v.front() : v[v.size() / 2];
}

// A deterministic input for layer `index`: token ids below the vocabulary
// for an embedding, values in [-1, 1) otherwise.
absl::StatusOr<Tensor> ProfileInput(const v1::ModelSpec& spec, int index,
                                    const Shape& shape) {
  ASSIGN_OR_RETURN(Tensor t, Tensor::TryHost(shape));
  const auto& layer = spec.layers(index);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] =
        layer.has_embedding()
            ? static_cast<float>(i % layer.embedding().vocab_size())
            : 2.0f * math::UniformAt(index, static_cast<uint64_t>(i)) - 1.0f;
  }
  return t;
}

const char* LayerKind(const v1::LayerSpec& layer) {
  const auto* field =
      layer.GetDescriptor()->FindFieldByNumber(layer.kind_case());
  return field == nullptr ? "?" : field->name().c_str();
}

// A request's sizes, checked before anything is allocated: the batch and
// every layer's activation of it within the spec limits, and a bounded
// number of repetitions (each holds the worker's control thread).
absl::Status CheckProfileSizes(const std::vector<Shape>& shapes, int64_t batch,
                               int repetitions) {
  if (batch > kMaxBatchSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: ", batch, " exceeds the limit of ", kMaxBatchSize));
  }
  if (repetitions > kMaxProfileRepetitions) {
    return absl::InvalidArgumentError(absl::StrCat("repetitions: ", repetitions,
                                                   " exceeds the limit of ",
                                                   kMaxProfileRepetitions));
  }
  for (const Shape& sample : shapes) {
    Shape rows = {batch};
    rows.insert(rows.end(), sample.begin(), sample.end());
    RETURN_IF_ERROR(CheckedElements(rows, "a profiled activation").status());
  }
  return absl::OkStatus();
}

// One layer's timed runs, over every round.
struct LayerRuns {
  std::vector<double> forward, backward, optimizer;
  int64_t activation_bytes = 0;
  int64_t parameter_bytes = 0;
};

// Builds layers [begin, end) as one chain and times `repetitions` runs of a
// micro-batch through it after one warm-up, appending to runs[begin..end):
// the micro-batch's forward through every layer in order (with the loss
// and its gradient after the model's last layer, counted with that
// layer's forward), its backward through every layer in reverse, then the
// job's optimizer update of each layer's parameters; each layer timed in
// place. In place, not alone: a layer run alone, again and again on one
// input, finds its weights, input and workspace in cache, where a stage
// runs it between its neighbours; the character LM's layers summed 10-15%
// below the same layers run as a stage, and plans predicted steps that
// much short. With `reuse_weights` the weight-gradient products are held
// and run as a step runs them (weight_grad_queue.h): the micro-batch held
// once per micro-batch of a step, one product, each micro-batch's share
// counted with its layer's backward.
absl::Status TimeChain(const v1::TrainingSpec& spec,
                       const std::vector<Shape>& shapes, int begin, int end,
                       int64_t batch, int repetitions, bool reuse_weights,
                       Backend* backend, std::vector<LayerRuns>* runs) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> chain,
      Model::Build(spec.model(), begin, end, backend, spec.seed()));
  chain->ReuseWeights(reuse_weights);
  const int n = end - begin;
  const bool last = end == spec.model().layers_size();
  Shape in = {batch};
  in.insert(in.end(), shapes[begin].begin(), shapes[begin].end());
  ASSIGN_OR_RETURN(Tensor host_x, ProfileInput(spec.model(), begin, in));
  ASSIGN_OR_RETURN(Tensor x, ToDevice(backend, host_x));
  // The job's optimizer over each layer's parameters alone: its update
  // costs the same per parameter wherever the layer's stage ends.
  std::vector<std::unique_ptr<Optimizer>> optimizers(n);
  for (int j = 0; j < n; ++j) {
    ASSIGN_OR_RETURN(const int64_t params,
                     LayerParameters(spec.model().layers(begin + j)));
    (*runs)[begin + j].parameter_bytes =
        params * static_cast<int64_t>(sizeof(float));
    ASSIGN_OR_RETURN(optimizers[j],
                     Optimizer::Create(spec.optimizer(), backend));
  }
  // The timed backward passes add to the gradients (see below).
  const bool adds = spec.micro_batches() > 1;
  // A stage that reuses its weights also takes the weight gradients of a
  // step's micro-batches in one product unless it rematerializes
  // (DefersWeightGrads): each layer's products go to a queue of its own,
  // timed below.
  const bool defers = reuse_weights && !spec.rematerialize();
  std::vector<std::unique_ptr<WeightGradQueue>> queues(n);
  if (defers) {
    for (int j = 0; j < n; ++j) {
      queues[j] = std::make_unique<WeightGradQueue>(backend);
      chain->layer(j)->DeferWeightGrads(queues[j].get());
    }
  }
  std::vector<double> f(n), b(n), o(n);
  for (int rep = 0; rep <= repetitions; ++rep) {
    ForwardOptions options;
    std::vector<LayerContext> contexts(n);
    Tensor h = x;
    for (int j = 0; j < n; ++j) {
      const auto start = Clock::now();
      ASSIGN_OR_RETURN(h, chain->layer(j)->Forward(h, options, &contexts[j]));
      RETURN_IF_ERROR(backend->Synchronize());
      f[j] = SecondsSince(start);
      (*runs)[begin + j].activation_bytes = h.bytes();
    }
    if (last) {
      // The stage holding the last layer also computes the loss and its
      // gradient for every micro-batch (the schedule simulator folds the
      // loss into that forward): both count with this layer's forward.
      // Labels of class 0 cost what any valid labels do.
      Shape label_shape = h.shape();
      label_shape.pop_back();
      ASSIGN_OR_RETURN(Tensor labels, backend->Allocate(label_shape));
      SoftmaxCrossEntropyLoss loss(backend);
      LayerContext loss_context;
      const auto start = Clock::now();
      RETURN_IF_ERROR(loss.Forward(h, labels, &loss_context).status());
      RETURN_IF_ERROR(loss.Backward(1.0f / static_cast<float>(labels.numel()),
                                    &loss_context)
                          .status());
      RETURN_IF_ERROR(backend->Synchronize());
      f[n - 1] += SecondsSince(start);
    }
    ASSIGN_OR_RETURN(Tensor g, backend->Allocate(h.shape()));
    RETURN_IF_ERROR(backend->Fill(g.f32(), g.numel(), 1e-3f));
    // A step's first micro-batch writes the gradients, every later one
    // adds to them, reading them back (16 MiB for a 2048 x 2048 weight:
    // the wide MLP's stage backward measured 30% slower adding than
    // writing). Time the adding, as M - 1 of a step's M micro-batches do
    // it: the optimizer marks the gradients fresh after its update, and
    // they are marked held again below.
    if (rep == 0 || !adds) ZeroGrads(chain->params());
    for (int j = n; j-- > 0;) {
      const auto start = Clock::now();
      ASSIGN_OR_RETURN(g, chain->layer(j)->Backward(g, options, &contexts[j],
                                                    begin + j > 0));
      RETURN_IF_ERROR(backend->Synchronize());
      b[j] = SecondsSince(start);
    }
    // The held weight-gradient products: the micro-batch held as many
    // times as a step brings micro-batches (up to the queue's row limit),
    // run as the step runs them, each micro-batch's share counted with the
    // layer's backward.
    for (int j = 0; j < n && defers; ++j) {
      ASSIGN_OR_RETURN(const int64_t times,
                       queues[j]->Repeat(spec.micro_batches()));
      const auto start = Clock::now();
      RETURN_IF_ERROR(queues[j]->Flush());
      RETURN_IF_ERROR(backend->Synchronize());
      b[j] += SecondsSince(start) / static_cast<double>(times);
    }
    for (int j = 0; j < n; ++j) {
      Layer* layer = chain->layer(j);
      const std::vector<Param*> params = layer->params();
      o[j] = 0;
      if (params.empty()) continue;
      const auto start = Clock::now();
      float scale = 1.0f;
      if (optimizers[j]->clip_grad_norm() > 0) {
        ASSIGN_OR_RETURN(const double sum, GradSumSquares(backend, params));
        scale = ClipScale(sum, optimizers[j]->clip_grad_norm());
      }
      RETURN_IF_ERROR(optimizers[j]->Step(params, scale));
      // Reused weights are laid out again once a step, after the update.
      if (reuse_weights) {
        RETURN_IF_ERROR(layer->PrepareWeights(PackedCopies::kAll));
      }
      RETURN_IF_ERROR(backend->Synchronize());
      o[j] = SecondsSince(start);
    }
    if (adds) {
      for (Param* p : chain->params()) p->grad_fresh = false;
    }
    if (rep == 0) continue;  // rep 0 warms caches and allocators (and state)
    for (int j = 0; j < n; ++j) {
      (*runs)[begin + j].forward.push_back(f[j]);
      (*runs)[begin + j].backward.push_back(b[j]);
      (*runs)[begin + j].optimizer.push_back(o[j]);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::pair<int, int>>> ProfileChains(
    const v1::ModelSpec& model, int64_t max_parameter_bytes) {
  std::vector<std::pair<int, int>> chains;
  int begin = 0;
  int64_t bytes = 0;
  for (int i = 0; i < model.layers_size(); ++i) {
    ASSIGN_OR_RETURN(const int64_t params, LayerParameters(model.layers(i)));
    const int64_t layer_bytes = params * static_cast<int64_t>(sizeof(float));
    if (i > begin && bytes + layer_bytes > max_parameter_bytes) {
      chains.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += layer_bytes;
  }
  if (model.layers_size() > 0) chains.emplace_back(begin, model.layers_size());
  return chains;
}

absl::StatusOr<v1::ProfileResponse> ProfileLayers(
    const v1::TrainingSpec& spec, int64_t batch, int repetitions,
    Backend* backend, bool fastest, bool reuse_weights,
    int64_t max_chain_parameter_bytes) {
  ASSIGN_OR_RETURN(std::vector<Shape> shapes, ValidateModelSpec(spec.model()));
  if (batch <= 0) {
    batch = std::max<int64_t>(
        1, spec.batch_size() / std::max<int64_t>(1, spec.micro_batches()));
  }
  if (repetitions <= 0) repetitions = 3;
  RETURN_IF_ERROR(CheckProfileSizes(shapes, batch, repetitions));
  // For the fastest run, each repetition is a round through the layers
  // (every layer built again and warmed up): a stretch of time when another
  // process holds the core, or its sibling thread, then slows one run of a
  // layer, not all of its runs, and the layers' relative costs a plan rests
  // on hold. (Three rounds of three runs left one profile in five with a
  // layer 25% off on a loaded 2-core host; one run per round, one in fifty.)
  const int rounds = fastest ? repetitions : 1;
  const int layers = spec.model().layers_size();
  // An untimed round through every layer first. A worker's first profile
  // is its first work, and a fresh process ran the first layers at up to
  // twice their cost through their warm-up and timed runs alike (its heap
  // and the allocator's thresholds still growing): the character LM's
  // first block measured 20.8 ms against 9.5 in every later profile, and
  // the plan cut the model one block off balance.
  ASSIGN_OR_RETURN(const auto chains,
                   ProfileChains(spec.model(), max_chain_parameter_bytes));
  for (const auto& [begin, end] : chains) {
    std::vector<LayerRuns> discarded(layers);
    RETURN_IF_ERROR(TimeChain(spec, shapes, begin, end, batch, 1, reuse_weights,
                              backend, &discarded));
  }
  std::vector<LayerRuns> runs(layers);
  for (int round = 0; round < rounds; ++round) {
    const int reps = repetitions / rounds + (round < repetitions % rounds);
    for (const auto& [begin, end] : chains) {
      RETURN_IF_ERROR(TimeChain(spec, shapes, begin, end, batch, reps,
                                reuse_weights, backend, &runs));
    }
  }
  v1::ProfileResponse out;
  out.set_device(backend->Describe());
  for (int i = 0; i < layers; ++i) {
    v1::LayerProfile* p = out.add_layers();
    p->set_layer(i);
    p->set_kind(LayerKind(spec.model().layers(i)));
    p->set_forward_seconds(Summary(runs[i].forward, fastest));
    p->set_backward_seconds(Summary(runs[i].backward, fastest));
    p->set_optimizer_seconds(Summary(runs[i].optimizer, fastest));
    p->set_activation_bytes(runs[i].activation_bytes);
    p->set_parameter_bytes(runs[i].parameter_bytes);
  }
  return out;
}

absl::StatusOr<double> MeasureGemmGflops(Backend* backend) {
  constexpr int64_t n = 512;
  ASSIGN_OR_RETURN(Tensor a, backend->Allocate({n, n}));
  ASSIGN_OR_RETURN(Tensor c, backend->Allocate({n, n}));
  RETURN_IF_ERROR(backend->Fill(a.f32(), a.numel(), 0.5f));
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = Clock::now();
    RETURN_IF_ERROR(backend->Gemm(false, false, n, n, n, 1.0f, a.f32(), n,
                                  a.f32(), n, 0.0f, c.f32(), n));
    RETURN_IF_ERROR(backend->Synchronize());
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (rep > 0) best = std::min(best, s);  // rep 0 warms up
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace pipetrain
