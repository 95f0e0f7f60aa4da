// bench_wan: what slow and uneven links cost a pipeline, and what the wire
// format wins back, on the network lab's WAN scenarios
// (tests/netlab/wan_cluster.h: datacenter, two_regions, edge,
// mixed_speeds; delays are one-way, so two_regions' 20 ms is a 40 ms round
// trip) beside the same jobs on loopback.
//
// A scheduler and K = 2 workers (one BLAS thread each) run in network
// namespaces joined by the lab's link emulator; every (model, wire) job
// runs on the same cluster, one after another. Models: the MLP of
// bench_models.h (784-2048-2048-2048-10, batch 256 in 8 micro-batches,
// synthetic data) and the character Transformer LM of
// examples/char_transformer.job.json (batch 32 in 4 micro-batches). Wires:
// f32 and bf16 (JobSpec.wire_dtype), int8 and int4 (JobSpec.wire_compression
// of activations and gradients); a wire the cluster refuses at submit is
// reported "unsupported", one whose job fails "failed", and the bench goes
// on.
//
// Per (model, scenario, wire): samples/s (batch / the job's step time, the
// scheduler's mean over the last stage's last 20 steps, past the warm-up),
// its ratio to loopback with the same wire (wan_vs_loopback_<scenario>_
// <wire>_<model>), the bytes one sample puts on the pipeline's link as the
// wire format counts them (activation down plus gradient up,
// spec/wire_size.h) and as the lab's link carried them (the emulator's
// count between the worker hosts over the whole job, TCP/IP, HTTP/2 and
// frame headers and the final evaluation's 32 forward samples included),
// the planner's predicted step time and prediction_error = |predicted -
// measured| / measured. A wire whose link bytes exceed 1.5x its format's
// was not applied by the workers: it is reported "not applied" in every
// scenario and left out of the ratios. Figures are medians over
// PIPETRAIN_BENCH_REPS repetitions.
//
// Two configurations run by default (PIPETRAIN_BENCH_CONFIGS selects):
//   example       each model's job as written (GPipe, the batches above),
//                 in every scenario;
//   across_sites  what docs/DEPLOY.md ("Across sites") recommends for slow
//                 links: 2BW with the planner's extra warm-up
//                 (extraWarmup -1) and twice the micro-batches of the same
//                 size (batch 512 in 16, 64 in 8), in loopback, two_regions
//                 and edge. A cross-step schedule refuses gradient
//                 clipping: the LM trains without it here.
// Its ratios compare it with itself on loopback, like the example's.
//
// Knobs: PIPETRAIN_BENCH_REPS (1), PIPETRAIN_BENCH_STEPS (measured steps,
// 20, at most 20), PIPETRAIN_BENCH_WARMUP (3), PIPETRAIN_BENCH_MODEL (mlp or
// lm), PIPETRAIN_BENCH_WIRES (comma-separated, f32,bf16,int8,int4),
// PIPETRAIN_BENCH_SCENARIOS (comma-separated, all four; the across_sites
// configuration runs those of them it has), PIPETRAIN_BENCH_CONFIGS
// (comma-separated, example,across_sites). Needs root, /dev/net/tun and
// `ip netns`; PIPETRAIN_SKIP_NETNS=1 skips (exit 0). A configuration of
// one's own replaces both when any of these is set, in every scenario:
// PIPETRAIN_BENCH_SCHEDULE (a schedule name, e.g. 2bw; default: the job
// spec's), PIPETRAIN_BENCH_EXTRA_WARMUP (JobSpec.extra_warmup, 0; -1 lets
// the planner choose), PIPETRAIN_BENCH_BATCH_SCALE (1: both models' batch
// and micro-batch count times this, micro-batches the same size).
//
// Last line: {"bench":"wan", "wan_vs_loopback_<scenario>_<wire>_<model>":
// ..., "prediction_error_<scenario>_<wire>_<model>": ..., the same keys
// ending "_across_sites" for that configuration,
// "best_<scenario>_vs_loopback_<config>": the best wire's ratio, the lower
// of the two models' (each model's ends "_<model>_<config>"), and
// "best_two_regions_vs_loopback", "best_edge_vs_loopback": the best of
// the configurations'}.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_env.h"
#include "bench/bench_models.h"
#include "common/proto_json.h"
#include "spec/schedule.h"
#include "spec/vocabulary.h"
#include "tests/cluster_harness.h"
#include "tests/netlab/netlab.h"
#include "tests/netlab/wan_cluster.h"

namespace pipetrain {
namespace {

using netlab::JobCluster;
using netlab::JobRun;

// How every job of one configuration is set up beyond its model and wire.
struct Config {
  std::string name;
  std::optional<ScheduleKind> schedule;  // none: the job spec's
  int extra_warmup = 0;
  int batch_scale = 1;
  std::vector<std::string> scenarios;  // besides loopback
};

constexpr char kExample[] = "example";
constexpr char kAcrossSites[] = "across_sites";
constexpr char kCustom[] = "custom";  // the knobs'; its keys are example's

// `config` onto `job`, whose training spec is the model's.
void ApplyConfig(const Config& config, v1::JobSpec* job) {
  v1::TrainingSpec* training = job->mutable_training();
  // More micro-batches of the same size per step: the same bytes and
  // compute per micro-batch, with the fill and drain (a round trip of the
  // slow link per step) spread over more of them.
  training->set_batch_size(training->batch_size() * config.batch_scale);
  training->set_micro_batches(training->micro_batches() * config.batch_scale);
  if (!config.schedule.has_value()) return;
  job->set_schedule(ScheduleKindToProto(*config.schedule));
  if (IsCrossStep(*config.schedule)) {
    training->mutable_optimizer()->set_clip_grad_norm(0);
  }
  job->set_extra_warmup(config.extra_warmup);
}

constexpr int kWorkers = 2;
constexpr int kRecentSteps = 20;  // what the scheduler's step time covers
constexpr char kLoopback[] = "loopback";

std::vector<std::string> EnvList(const char* name,
                                 std::vector<std::string> fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return absl::StrSplit(v, ',', absl::SkipEmpty());
}

struct Model {
  std::string name;
  v1::TrainingSpec spec;
};

absl::StatusOr<std::vector<Model>> Models(int64_t steps) {
  std::vector<Model> out;
  v1::TrainingSpec mlp = WideMlpJob(steps);
  v1::TrainingSpec lm;
  const absl::Status read = ReadJsonFile(
      testing::SourcePath("examples/char_transformer.job.json"), &lm);
  if (!read.ok()) return read;
  lm.set_steps(steps);
  lm.set_epochs(0);
  lm.set_eval_every(0);
  const char* only = std::getenv("PIPETRAIN_BENCH_MODEL");
  if (only == nullptr || std::string(only) == "mlp")
    out.push_back({"mlp", mlp});
  if (only == nullptr || std::string(only) == "lm") out.push_back({"lm", lm});
  return out;
}

// The job spec of `wire`; false for a name this bench does not know.
bool ApplyWire(const std::string& wire, v1::JobSpec* job) {
  if (wire == "f32") {
    job->set_wire_dtype(v1::DTYPE_F32);
  } else if (wire == "bf16") {
    job->set_wire_dtype(v1::DTYPE_BF16);
  } else if (wire == "int8" || wire == "int4") {
    const v1::WireQuantization q = wire == "int8" ? v1::WIRE_QUANTIZATION_INT8
                                                  : v1::WIRE_QUANTIZATION_INT4;
    job->mutable_wire_compression()->set_activations(q);
    job->mutable_wire_compression()->set_gradients(q);
  } else {
    return false;
  }
  return true;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One (model, scenario, wire) over the repetitions.
struct Cell {
  std::string outcome = "ok";  // or "unsupported: ...", "failed: ..."
  std::vector<double> step_seconds;
  std::vector<double> predicted_seconds;
  int64_t bytes_per_sample = -1;              // the wire format's
  std::vector<double> link_bytes_per_sample;  // measured on the lab's link
  int batch = 0;
};

// The wire format's bytes against what the lab's link carried: a job that
// ran but did not apply its wire format (a worker that ignores it) is
// caught here, not reported as a gain.
bool WireNotApplied(const Cell& cell) {
  return cell.bytes_per_sample > 0 && !cell.link_bytes_per_sample.empty() &&
         Median(cell.link_bytes_per_sample) > 1.5 * cell.bytes_per_sample;
}

std::string Key(const std::string& config, const std::string& model,
                const std::string& scenario, const std::string& wire) {
  return absl::StrCat(config, "/", model, "/", scenario, "/", wire);
}

bool Runs(const Config& config, const std::string& scenario) {
  return scenario == kLoopback ||
         std::find(config.scenarios.begin(), config.scenarios.end(),
                   scenario) != config.scenarios.end();
}

// Every configuration that has `scenario`, on one cluster.
void RunScenario(const std::string& scenario_name, int rep,
                 const std::vector<Config>& configs,
                 const std::vector<Model>& models,
                 const std::vector<std::string>& wires, int warmup,
                 std::map<std::string, Cell>* cells) {
  absl::StatusOr<std::unique_ptr<JobCluster>> cluster;
  if (scenario_name == kLoopback) {
    cluster = JobCluster::OnLoopback(kWorkers);
    std::printf("== %s (rep %d)\n", scenario_name.c_str(), rep + 1);
  } else {
    auto scenario = netlab::MakeScenario(scenario_name, kWorkers);
    if (!scenario.ok()) {
      std::printf("%s: %s\n", scenario_name.c_str(),
                  scenario.status().ToString().c_str());
      std::exit(1);
    }
    cluster = JobCluster::InScenario(*scenario, kWorkers);
    std::printf("== %s (rep %d): %s\n", scenario_name.c_str(), rep + 1,
                scenario->description.c_str());
    if (cluster.ok()) {
      auto rtt = (*cluster)->MeasureRtt("w0", "w1");
      std::printf("   w0 <-> w1 round trip: configured %.1f ms, emulated %s\n",
                  scenario->configured_rtt_s * 1e3,
                  rtt.ok() ? absl::StrFormat("%.1f ms", *rtt * 1e3).c_str()
                           : rtt.status().ToString().c_str());
    }
  }
  if (!cluster.ok()) {
    std::printf("cannot start the %s cluster: %s\n", scenario_name.c_str(),
                cluster.status().ToString().c_str());
    std::exit(1);
  }
  for (const Config& config : configs) {
    if (!Runs(config, scenario_name)) continue;
    for (const Model& model : models) {
      for (const std::string& wire : wires) {
        Cell& cell =
            (*cells)[Key(config.name, model.name, scenario_name, wire)];
        if (cell.outcome != "ok") continue;  // refused in an earlier rep
        v1::JobSpec job;
        *job.mutable_training() = model.spec;
        job.mutable_training()->set_steps(model.spec.steps() + warmup);
        job.set_num_stages(kWorkers);
        job.set_eval_samples(32);  // its forward pass crosses the link too
        ApplyConfig(config, &job);
        if (!ApplyWire(wire, &job)) {
          cell.outcome = "unsupported: unknown to this bench";
          continue;
        }
        cell.batch = job.training().batch_size();
        const JobRun run = (*cluster)->Run(job, 600);
        if (!run.submitted.ok()) {
          cell.outcome = absl::StrCat("unsupported: ", run.submitted.message());
        } else if (!run.completed || run.step_seconds <= 0) {
          cell.outcome =
              absl::StrCat("failed: ", v1::JobState_Name(run.job.state()), " ",
                           run.job.error());
        } else {
          cell.step_seconds.push_back(run.step_seconds);
          cell.predicted_seconds.push_back(run.plan.predicted_step_seconds());
          cell.bytes_per_sample = netlab::WireBytesPerSample(job, run.plan);
          if (run.worker_link_bytes >= 0) {
            cell.link_bytes_per_sample.push_back(
                double(run.worker_link_bytes) /
                double(job.training().steps() * job.training().batch_size()));
          }
        }
        // Where the planner cut the model, which worker holds stage 0, and
        // the compute per micro-batch the planner predicted for each stage.
        std::string plan;
        for (const v1::PlannedStage& stage : run.plan.stages()) {
          absl::StrAppend(
              &plan, plan.empty() ? "" : " | ", "layers ", stage.layer_begin(),
              "-", stage.layer_end(), " on ", stage.worker_address(),
              absl::StrFormat(" %.1f ms", stage.compute_seconds() * 1e3));
          if (stage.link_bandwidth_bytes_per_s() > 0) {
            absl::StrAppend(
                &plan,
                absl::StrFormat(", link %.0f Mb/s %.1f ms",
                                stage.link_bandwidth_bytes_per_s() * 8 / 1e6,
                                stage.link_rtt_seconds() * 1e3));
          }
        }
        if (run.plan.extra_warmup() > 0) {
          absl::StrAppend(&plan, ", extra warm-up ", run.plan.extra_warmup());
        }
        std::printf(
            "   %-12s %-4s %-5s %s\n", config.name.c_str(), model.name.c_str(),
            wire.c_str(),
            cell.outcome == "ok"
                ? absl::StrFormat("step %.4f s (%s)", run.step_seconds, plan)
                      .c_str()
                : cell.outcome.c_str());
        std::fflush(stdout);
      }
    }
  }
}

// The configurations to run: one of the knobs' own, or those
// PIPETRAIN_BENCH_CONFIGS names. False (said) for a bad knob.
bool ChooseConfigs(const std::vector<std::string>& scenarios,
                   std::vector<Config>* out) {
  const char* schedule = std::getenv("PIPETRAIN_BENCH_SCHEDULE");
  const char* extra = std::getenv("PIPETRAIN_BENCH_EXTRA_WARMUP");
  const char* scale = std::getenv("PIPETRAIN_BENCH_BATCH_SCALE");
  if (schedule != nullptr || extra != nullptr || scale != nullptr) {
    Config own;
    own.name = kCustom;
    own.scenarios = scenarios;
    own.batch_scale =
        static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_BATCH_SCALE", 1));
    if (schedule != nullptr && *schedule != '\0') {
      const absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(schedule);
      if (!kind.ok()) {
        std::printf("bench_wan: PIPETRAIN_BENCH_SCHEDULE: %s\n",
                    kind.status().ToString().c_str());
        return false;
      }
      own.schedule = *kind;
    }
    if (extra != nullptr && !absl::SimpleAtoi(extra, &own.extra_warmup)) {
      std::printf("bench_wan: PIPETRAIN_BENCH_EXTRA_WARMUP: not an integer\n");
      return false;
    }
    std::printf("bench_wan: schedule %s, extra warm-up %s, batch scale %d\n",
                schedule == nullptr ? "the job's" : schedule,
                own.extra_warmup == -1 ? "auto"
                                       : absl::StrCat(own.extra_warmup).c_str(),
                own.batch_scale);
    out->push_back(own);
    return true;
  }
  for (const std::string& name :
       EnvList("PIPETRAIN_BENCH_CONFIGS", {kExample, kAcrossSites})) {
    Config c;
    c.name = name;
    if (name == kExample) {
      c.scenarios = scenarios;
    } else if (name == kAcrossSites) {
      c.schedule = ScheduleKind::kTwoBW;
      c.extra_warmup = kAutoExtraWarmup;
      c.batch_scale = 2;
      for (const std::string& s : scenarios) {
        if (s == "two_regions" || s == "edge") c.scenarios.push_back(s);
      }
    } else {
      std::printf(
          "bench_wan: PIPETRAIN_BENCH_CONFIGS: unknown \"%s\" "
          "(example, across_sites)\n",
          name.c_str());
      return false;
    }
    out->push_back(c);
  }
  return true;
}

int Main() {
  if (netlab::SkipRequested()) {
    std::printf("bench_wan: PIPETRAIN_SKIP_NETNS=1, skipped\n");
    return 0;
  }
  if (absl::Status ready = netlab::CheckLabPrerequisites(); !ready.ok()) {
    std::printf("bench_wan: %s\n", ready.ToString().c_str());
    return 1;
  }
  const int reps = static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_REPS", 1));
  const int steps =
      std::min(static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_STEPS", 20)),
               kRecentSteps);
  const int warmup =
      static_cast<int>(PositiveEnvInt("PIPETRAIN_BENCH_WARMUP", 3));
  const std::vector<std::string> wires =
      EnvList("PIPETRAIN_BENCH_WIRES", {"f32", "bf16", "int8", "int4"});
  const std::vector<std::string> scenarios =
      EnvList("PIPETRAIN_BENCH_SCENARIOS", netlab::ScenarioNames());
  std::vector<Config> configs;
  if (!ChooseConfigs(scenarios, &configs)) return 1;
  auto models = Models(steps);
  if (!models.ok()) {
    std::printf("bench_wan: %s\n", models.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "bench_wan: K = %d workers, %d measured steps after %d warm-up, %d "
      "repetition(s)\n",
      kWorkers, steps, warmup, reps);
  std::vector<std::string> all = {kLoopback};
  all.insert(all.end(), scenarios.begin(), scenarios.end());
  std::map<std::string, Cell> cells;
  for (int rep = 0; rep < reps; ++rep) {
    for (const std::string& scenario : all) {
      bool any = false;
      for (const Config& c : configs) any = any || Runs(c, scenario);
      if (any)
        RunScenario(scenario, rep, configs, *models, wires, warmup, &cells);
    }
  }

  // A wire format some lab run shows unapplied is void in every scenario.
  std::map<std::string, std::string> not_applied;  // model/wire -> why
  for (const Config& config : configs) {
    for (const Model& model : *models) {
      for (const std::string& scenario : all) {
        for (const std::string& wire : wires) {
          const Cell& cell =
              cells[Key(config.name, model.name, scenario, wire)];
          if (cell.outcome != "ok" || !WireNotApplied(cell)) continue;
          not_applied[model.name + "/" + wire] = absl::StrFormat(
              "not applied: the %s link carried %.0f bytes/sample, the wire "
              "format takes %d",
              scenario, Median(cell.link_bytes_per_sample),
              cell.bytes_per_sample);
        }
      }
    }
  }
  std::printf("\n%-12s %-5s %-13s %-5s %10s %8s %13s %13s %9s %11s %8s\n",
              "config", "model", "scenario", "wire", "samples/s", "vs_loop",
              "wire_B/sample", "link_B/sample", "step_s", "predicted_s",
              "pred_err");
  std::vector<std::string> json = {"\"bench\":\"wan\""};
  // config -> scenario -> model -> the best wire's ratio
  std::map<std::string, std::map<std::string, std::map<std::string, double>>>
      best;
  for (const Config& config : configs) {
    const std::string tail = config.name == kExample || config.name == kCustom
                                 ? ""
                                 : absl::StrCat("_", config.name);
    for (const Model& model : *models) {
      for (const std::string& scenario : all) {
        if (!Runs(config, scenario)) continue;
        for (const std::string& wire : wires) {
          const Cell& cell =
              cells[Key(config.name, model.name, scenario, wire)];
          std::string outcome = cell.outcome;
          if (auto it = not_applied.find(model.name + "/" + wire);
              outcome == "ok" && it != not_applied.end()) {
            outcome = it->second;
          }
          if (outcome != "ok") {
            std::printf("%-12s %-5s %-13s %-5s %s\n", config.name.c_str(),
                        model.name.c_str(), scenario.c_str(), wire.c_str(),
                        outcome.c_str());
            continue;
          }
          const double step = Median(cell.step_seconds);
          const double predicted = Median(cell.predicted_seconds);
          const double rate = cell.batch / step;
          const Cell& loop =
              cells[Key(config.name, model.name, kLoopback, wire)];
          const double ratio = loop.outcome == "ok" && scenario != kLoopback
                                   ? Median(loop.step_seconds) / step
                                   : NAN;
          const double error = std::fabs(predicted - step) / step;
          const std::string ratio_text =
              std::isnan(ratio) ? "-" : absl::StrFormat("%.3f", ratio);
          const std::string link_text =
              cell.link_bytes_per_sample.empty()
                  ? "-"
                  : absl::StrFormat("%.0f", Median(cell.link_bytes_per_sample));
          std::printf(
              "%-12s %-5s %-13s %-5s %10.1f %8s %13lld %13s %9.4f %11.4f "
              "%8.3f\n",
              config.name.c_str(), model.name.c_str(), scenario.c_str(),
              wire.c_str(), rate, ratio_text.c_str(),
              static_cast<long long>(cell.bytes_per_sample), link_text.c_str(),
              step, predicted, error);
          const std::string suffix =
              absl::StrCat(scenario, "_", wire, "_", model.name, tail);
          json.push_back(
              absl::StrFormat("\"prediction_error_%s\":%.4f", suffix, error));
          if (std::isnan(ratio)) continue;
          json.push_back(
              absl::StrFormat("\"wan_vs_loopback_%s\":%.4f", suffix, ratio));
          double& b = best[config.name][scenario][model.name];
          b = std::max(b, ratio);
        }
      }
    }
  }
  std::map<std::string, double> overall;  // scenario -> best configuration's
  for (const auto& [config, by_scenario] : best) {
    for (const auto& [scenario, by_model] : by_scenario) {
      double lowest = INFINITY;
      for (const auto& [model, ratio] : by_model) {
        json.push_back(absl::StrFormat("\"best_%s_vs_loopback_%s_%s\":%.4f",
                                       scenario, model, config, ratio));
        lowest = std::min(lowest, ratio);
      }
      json.push_back(absl::StrFormat("\"best_%s_vs_loopback_%s\":%.4f",
                                     scenario, config, lowest));
      overall[scenario] = std::max(overall[scenario], lowest);
    }
  }
  for (const auto& [scenario, ratio] : overall) {
    json.push_back(
        absl::StrFormat("\"best_%s_vs_loopback\":%.4f", scenario, ratio));
  }
  std::printf("{%s}\n", absl::StrJoin(json, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
