// bench_schedules: every schedule the stage executor runs, side by side in
// one run, on worker processes: the MLP 784-2048-2048-2048-10 (batch 256,
// M = 8) on K = 2 workers, and the character Transformer LM on K = 3.
// Per schedule: samples/s, each stage's measured idle fraction beside the
// schedule's theoretical bubble, and peak activation memory per stage.
//
// Last line: {"bench":"schedules", "<model>_<schedule>_samples_per_s": ...}.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_models.h"
#include "common/proto_json.h"
#include "spec/schedule.h"
#include "tests/cluster_harness.h"

namespace pipetrain {
namespace {

constexpr int kWarmupSteps = 2;

struct Case {
  const char* name;
  v1::TrainingSpec spec;
  std::vector<int> cuts;
  // Interleaved: cuts into K * 2 chunks (empty: the model is too short).
  std::vector<int> chunk_cuts;
};

v1::TrainingSpec MlpSpec() {
  v1::TrainingSpec spec = WideMlpJob(kWarmupSteps + 10);
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0);
  return spec;
}

v1::TrainingSpec LmSpec() {
  v1::TrainingSpec spec;
  (void)ReadJsonFile(testing::SourcePath("examples/char_transformer.job.json"),
                     &spec);
  spec.set_micro_batches(8);
  spec.set_steps(kWarmupSteps + 10);
  // The asynchronous schedules take no global clipping; compare all alike.
  spec.mutable_optimizer()->set_clip_grad_norm(0);
  return spec;
}

int Main() {
  std::vector<testing::Worker> workers;
  for (int i = 0; i < 3; ++i) {
    auto w = testing::StartWorker({"--threads=1"});
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
      return 1;
    }
    workers.push_back(std::move(*w));
  }
  // The MLP's 7 layers make 4 chunks for K = 2, v = 2; the LM's 5 layers
  // are too few for K = 3, v = 2.
  const std::vector<Case> cases = {{"mlp", MlpSpec(), {3}, {1, 3, 5}},
                                   {"lm", LmSpec(), {2, 3}, {}}};
  const std::vector<std::pair<const char*, v1::ScheduleKindProto>> kinds = {
      {"gpipe", v1::SCHEDULE_GPIPE}, {"1f1b-flush", v1::SCHEDULE_1F1B_FLUSH},
      {"zb-h1", v1::SCHEDULE_ZB_H1}, {"1f1b-async", v1::SCHEDULE_ASYNC_1F1B},
      {"2bw", v1::SCHEDULE_2BW},     {"interleaved", v1::SCHEDULE_INTERLEAVED}};
  std::string json = "{\"bench\":\"schedules\"";
  int job = 0;
  for (const Case& c : cases) {
    const int k = static_cast<int>(c.cuts.size()) + 1;
    double gpipe_rate = 0;
    for (const auto& [name, kind] : kinds) {
      testing::PipelineOptions options;
      options.schedule = kind;
      options.fetch_weights = false;
      const bool interleaved = kind == v1::SCHEDULE_INTERLEAVED;
      if (interleaved && c.chunk_cuts.empty()) {
        std::printf(
            "%-4s K=%d interleaved: skipped (fewer layers than chunks)\n",
            c.name, k);
        continue;
      }
      if (interleaved) options.virtual_stages = 2;
      const testing::PipelineRun run = testing::RunPipeline(
          workers, absl::StrFormat("%s-%d", c.name, ++job), c.spec,
          interleaved ? c.chunk_cuts : c.cuts, options);
      if (!run.status.ok()) {
        std::printf("%s %s: %s\n", c.name, name, run.status.ToString().c_str());
        continue;
      }
      const double step = MeanStepSeconds(run.stages.back(), kWarmupSteps);
      const double rate = c.spec.batch_size() / step;
      if (kind == v1::SCHEDULE_GPIPE) gpipe_rate = rate;
      ScheduleParams params;
      params.kind = *ParseScheduleKind(name);
      params.num_stages = k;
      params.micro_batches = static_cast<int>(c.spec.micro_batches());
      if (interleaved) params.virtual_stages = 2;
      const double theory = TheoreticalBubble(params, SimCosts());
      std::printf(
          "%-4s K=%d M=%lld %-11s %8.1f samples/s (%.2fx GPipe); bubble theory "
          "%.1f%%;",
          c.name, k, static_cast<long long>(c.spec.micro_batches()), name, rate,
          gpipe_rate > 0 ? rate / gpipe_rate : 0, 100 * theory);
      for (int s = 0; s < k; ++s) {
        std::printf(" s%d idle %.1f%% peak %.1f MiB;", s,
                    100 * run.stages[s].idle_fraction(),
                    run.stages[s].peak_activation_bytes() / 1048576.0);
      }
      std::printf("\n");
      json += absl::StrFormat(
          ",\"%s_%s_samples_per_s\":%.1f,\"%s_%s_vs_gpipe\":%.3f,"
          "\"%s_%s_stage0_idle\":%.3f,\"%s_%s_theory_bubble\":%.3f,"
          "\"%s_%s_stage0_peak_mib\":%.2f",
          c.name, name, rate, c.name, name,
          gpipe_rate > 0 ? rate / gpipe_rate : 0, c.name, name,
          run.stages[0].idle_fraction(), c.name, name, theory, c.name, name,
          run.stages[0].peak_activation_bytes() / 1048576.0);
    }
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
