// bench_pipeline: the MLP 784-2048-2048-2048-10 (batch 256, M = 8) on K = 2
// worker processes with one BLAS thread each, split after the second
// Linear, beside the in-process trainer with two threads, in one run.
//
// efficiency_vs_schedule = the step time the GPipe schedule predicts from
// the per-micro-batch forward/backward times the stages measured in this
// run, divided by the measured step time: what transport and executor cost.
// ratio_vs_inprocess = pipeline samples/s over in-process samples/s.
//
// Last line: {"bench":"pipeline", ...}.
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "bench/bench_models.h"
#include "spec/schedule.h"
#include "tests/cluster_harness.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/nn/model.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

constexpr int kWarmupSteps = 2;
constexpr int kSteps = 12;

v1::TrainingSpec Spec(bool remat) {
  v1::TrainingSpec spec = WideMlpJob(kWarmupSteps + kSteps);
  spec.set_rematerialize(remat);
  return spec;
}

int Main() {
  // The in-process reference with two threads.
  double inprocess_step = 0;
  {
    auto backend = CreateCpuBackend(2);
    auto trainer = LocalTrainer::Create(Spec(false), backend.get());
    if (!trainer.ok()) {
      std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
      return 1;
    }
    double sum = 0;
    for (int i = 0; i < kWarmupSteps + kSteps; ++i) {
      auto r = (*trainer)->Step();
      if (!r.ok()) return 1;
      if (i >= kWarmupSteps) sum += r->seconds;
    }
    inprocess_step = sum / kSteps;
  }
  std::vector<testing::Worker> workers;
  for (int i = 0; i < 2; ++i) {
    auto w = testing::StartWorker({"--threads=1"});
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
      return 1;
    }
    workers.push_back(std::move(*w));
  }
  // Layers: fc1 relu fc2 | relu fc3 relu fc4 (split after the 2nd Linear).
  const std::vector<int> cuts = {3};
  testing::PipelineOptions options;
  options.fetch_weights = false;
  testing::PipelineRun runs[2];
  for (int remat = 0; remat < 2; ++remat) {
    runs[remat] = testing::RunPipeline(workers, remat ? "remat" : "plain",
                                       Spec(remat), cuts, options);
    if (!runs[remat].status.ok()) {
      std::fprintf(stderr, "%s\n", runs[remat].status.ToString().c_str());
      return 1;
    }
  }
  const testing::PipelineRun& run = runs[0];
  const double pipeline_step = MeanStepSeconds(run.stages.back(), kWarmupSteps);

  // What GPipe predicts from the stages' own measured times.
  ScheduleParams params;
  params.kind = ScheduleKind::kGPipe;
  params.num_stages = 2;
  params.micro_batches = 8;
  std::vector<SimCosts> costs;
  for (const auto& s : run.stages) {
    SimCosts c;
    c.forward = s.forward_seconds();
    c.backward = s.backward_seconds();
    c.optimizer = s.optimizer_seconds();
    costs.push_back(c);
  }
  const SimResult predicted = Simulate(params, costs[0], costs);
  const double efficiency = predicted.makespan / pipeline_step;
  const double ratio = inprocess_step / pipeline_step;
  const double bubble = TheoreticalBubble(params, SimCosts());

  std::printf("in-process (2 threads): %.1f ms/step = %.0f samples/s\n",
              inprocess_step * 1e3, 256 / inprocess_step);
  std::printf(
      "pipeline K=2 M=8 (1 thread each): %.1f ms/step = %.0f samples/s\n",
      pipeline_step * 1e3, 256 / pipeline_step);
  for (size_t s = 0; s < run.stages.size(); ++s) {
    const auto& st = run.stages[s];
    std::printf(
        "  stage %zu: forward %.2f ms, backward %.2f ms per micro-batch; "
        "idle %.1f%% (schedule theory %.1f%%, simulated with measured costs "
        "%.1f%%); peak activations %.1f MiB, with re-materialization %.1f "
        "MiB\n",
        s, st.forward_seconds() * 1e3, st.backward_seconds() * 1e3,
        100 * st.idle_fraction(), 100 * bubble,
        100 * predicted.idle_fraction[s],
        st.peak_activation_bytes() / 1048576.0,
        runs[1].stages[s].peak_activation_bytes() / 1048576.0);
  }
  std::printf(
      "schedule-predicted step %.1f ms; efficiency_vs_schedule %.3f; "
      "ratio_vs_inprocess %.3f\n",
      predicted.makespan * 1e3, efficiency, ratio);
  std::printf(
      "%s\n",
      absl::StrFormat(
          "{\"bench\":\"pipeline\",\"inprocess_samples_per_s\":%.1f,"
          "\"pipeline_samples_per_s\":%.1f,\"predicted_step_ms\":%.2f,"
          "\"measured_step_ms\":%.2f,\"efficiency_vs_schedule\":%.3f,"
          "\"ratio_vs_inprocess\":%.3f,\"stage0_idle\":%.3f,\"stage1_idle\":%."
          "3f,"
          "\"theoretical_bubble\":%.3f,\"stage0_peak_mib\":%.1f,"
          "\"stage0_peak_remat_mib\":%.1f}",
          256 / inprocess_step, 256 / pipeline_step, predicted.makespan * 1e3,
          pipeline_step * 1e3, efficiency, ratio, run.stages[0].idle_fraction(),
          run.stages[1].idle_fraction(), bubble,
          run.stages[0].peak_activation_bytes() / 1048576.0,
          runs[1].stages[0].peak_activation_bytes() / 1048576.0)
          .c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
