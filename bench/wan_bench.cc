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
// Knobs: PIPETRAIN_BENCH_REPS (1), PIPETRAIN_BENCH_STEPS (measured steps,
// 20, at most 20), PIPETRAIN_BENCH_WARMUP (3), PIPETRAIN_BENCH_MODEL (mlp or
// lm), PIPETRAIN_BENCH_WIRES (comma-separated, f32,bf16,int8,int4),
// PIPETRAIN_BENCH_SCENARIOS (comma-separated, all four),
// PIPETRAIN_BENCH_BATCH_SCALE (1: both models' batch and micro-batch count
// times this, micro-batches the same size). Needs root,
// /dev/net/tun and `ip netns`; PIPETRAIN_SKIP_NETNS=1 skips (exit 0).
// PIPETRAIN_BENCH_SCHEDULE (a schedule name, e.g. 2bw; default: the job
// spec's default) and PIPETRAIN_BENCH_EXTRA_WARMUP (JobSpec.extra_warmup,
// 0; -1 lets the planner choose) run every job under that schedule,
// loopback included; a cross-step
// schedule drops the LM's gradient clipping, which it refuses.
//
// Last line: {"bench":"wan", "wan_vs_loopback_<scenario>_<wire>_<model>":
// ..., "best_two_regions_vs_loopback": ..., "best_edge_vs_loopback": ...,
// "prediction_error_<scenario>_<wire>_<model>": ...}; best_<scenario>_vs_
// loopback is the best wire's ratio, the lower of the two models' (each
// model's is best_<scenario>_vs_loopback_<model>).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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

// PIPETRAIN_BENCH_SCHEDULE and PIPETRAIN_BENCH_EXTRA_WARMUP onto `job`
// (checked in main: a bad name never reaches here).
void ApplyScheduleKnobs(v1::JobSpec* job) {
  const char* name = std::getenv("PIPETRAIN_BENCH_SCHEDULE");
  if (name == nullptr || *name == '\0') return;
  const absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(name);
  if (!kind.ok()) return;
  job->set_schedule(ScheduleKindToProto(*kind));
  if (IsCrossStep(*kind)) {
    job->mutable_training()->mutable_optimizer()->set_clip_grad_norm(0);
  }
  const char* extra = std::getenv("PIPETRAIN_BENCH_EXTRA_WARMUP");
  int value = 0;
  if (extra != nullptr && absl::SimpleAtoi(extra, &value)) {
    job->set_extra_warmup(value);
  }
}

constexpr int kWorkers = 2;
constexpr int kRecentSteps = 20;  // what the scheduler's step time covers
constexpr char kLoopback[] = "loopback";

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out = 0;
  if (v == nullptr || !absl::SimpleAtoi(v, &out) || out < 1) return fallback;
  return out;
}

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
  // More micro-batches of the same size per step: the same bytes and
  // compute per micro-batch, with the fill and drain (a round trip of the
  // slow link per step) spread over more of them.
  const int scale = EnvInt("PIPETRAIN_BENCH_BATCH_SCALE", 1);
  for (v1::TrainingSpec* spec : {&mlp, &lm}) {
    spec->set_batch_size(spec->batch_size() * scale);
    spec->set_micro_batches(spec->micro_batches() * scale);
  }
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

std::string Key(const std::string& model, const std::string& scenario,
                const std::string& wire) {
  return absl::StrCat(model, "/", scenario, "/", wire);
}

void RunScenario(const std::string& scenario_name, int rep,
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
  for (const Model& model : models) {
    for (const std::string& wire : wires) {
      Cell& cell = (*cells)[Key(model.name, scenario_name, wire)];
      if (cell.outcome != "ok") continue;  // refused in an earlier rep
      v1::JobSpec job;
      *job.mutable_training() = model.spec;
      job.mutable_training()->set_steps(model.spec.steps() + warmup);
      job.set_num_stages(kWorkers);
      job.set_eval_samples(32);  // its forward pass crosses the link too
      ApplyScheduleKnobs(&job);
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
      std::printf("   %-4s %-5s %s\n", model.name.c_str(), wire.c_str(),
                  cell.outcome == "ok" ? absl::StrFormat("step %.4f s (%s)",
                                                         run.step_seconds, plan)
                                             .c_str()
                                       : cell.outcome.c_str());
      std::fflush(stdout);
    }
  }
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
  const int reps = EnvInt("PIPETRAIN_BENCH_REPS", 1);
  const int steps = std::min(EnvInt("PIPETRAIN_BENCH_STEPS", 20), kRecentSteps);
  const int warmup = EnvInt("PIPETRAIN_BENCH_WARMUP", 3);
  const std::vector<std::string> wires =
      EnvList("PIPETRAIN_BENCH_WIRES", {"f32", "bf16", "int8", "int4"});
  const std::vector<std::string> scenarios =
      EnvList("PIPETRAIN_BENCH_SCENARIOS", netlab::ScenarioNames());
  if (const char* name = std::getenv("PIPETRAIN_BENCH_SCHEDULE");
      name != nullptr && *name != '\0') {
    if (absl::Status bad = ParseScheduleKind(name).status(); !bad.ok()) {
      std::printf("bench_wan: PIPETRAIN_BENCH_SCHEDULE: %s\n",
                  bad.ToString().c_str());
      return 1;
    }
    const char* extra = std::getenv("PIPETRAIN_BENCH_EXTRA_WARMUP");
    std::printf("bench_wan: schedule %s, extra warm-up %s\n", name,
                extra == nullptr             ? "0"
                : std::string(extra) == "-1" ? "auto"
                                             : extra);
  }
  auto models = Models(steps);
  if (!models.ok()) {
    std::printf("bench_wan: %s\n", models.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "bench_wan: K = %d workers, %d measured steps after %d warm-up, %d "
      "repetition(s), batch scale %d\n",
      kWorkers, steps, warmup, reps, EnvInt("PIPETRAIN_BENCH_BATCH_SCALE", 1));
  std::vector<std::string> all = {kLoopback};
  all.insert(all.end(), scenarios.begin(), scenarios.end());
  std::map<std::string, Cell> cells;
  for (int rep = 0; rep < reps; ++rep) {
    for (const std::string& scenario : all) {
      RunScenario(scenario, rep, *models, wires, warmup, &cells);
    }
  }

  // A wire format some lab run shows unapplied is void in every scenario.
  std::map<std::string, std::string> not_applied;  // model/wire -> why
  for (const Model& model : *models) {
    for (const std::string& scenario : all) {
      for (const std::string& wire : wires) {
        const Cell& cell = cells[Key(model.name, scenario, wire)];
        if (cell.outcome == "ok" && WireNotApplied(cell)) {
          not_applied[model.name + "/" + wire] = absl::StrFormat(
              "not applied: the %s link carried %.0f bytes/sample, the wire "
              "format takes %d",
              scenario, Median(cell.link_bytes_per_sample),
              cell.bytes_per_sample);
        }
      }
    }
  }
  std::printf("\n%-5s %-13s %-5s %10s %8s %13s %13s %9s %11s %8s\n", "model",
              "scenario", "wire", "samples/s", "vs_loop", "wire_B/sample",
              "link_B/sample", "step_s", "predicted_s", "pred_err");
  std::vector<std::string> json = {"\"bench\":\"wan\""};
  std::map<std::string, std::map<std::string, double>> best;  // scen->model
  for (const Model& model : *models) {
    for (const std::string& scenario : all) {
      for (const std::string& wire : wires) {
        const Cell& cell = cells[Key(model.name, scenario, wire)];
        std::string outcome = cell.outcome;
        if (auto it = not_applied.find(model.name + "/" + wire);
            outcome == "ok" && it != not_applied.end()) {
          outcome = it->second;
        }
        if (outcome != "ok") {
          std::printf("%-5s %-13s %-5s %s\n", model.name.c_str(),
                      scenario.c_str(), wire.c_str(), outcome.c_str());
          continue;
        }
        const double step = Median(cell.step_seconds);
        const double predicted = Median(cell.predicted_seconds);
        const double rate = cell.batch / step;
        const Cell& loop = cells[Key(model.name, kLoopback, wire)];
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
            "%-5s %-13s %-5s %10.1f %8s %13lld %13s %9.4f %11.4f %8.3f\n",
            model.name.c_str(), scenario.c_str(), wire.c_str(), rate,
            ratio_text.c_str(), static_cast<long long>(cell.bytes_per_sample),
            link_text.c_str(), step, predicted, error);
        const std::string suffix =
            absl::StrCat(scenario, "_", wire, "_", model.name);
        json.push_back(
            absl::StrFormat("\"prediction_error_%s\":%.4f", suffix, error));
        if (std::isnan(ratio)) continue;
        json.push_back(
            absl::StrFormat("\"wan_vs_loopback_%s\":%.4f", suffix, ratio));
        double& b = best[scenario][model.name];
        b = std::max(b, ratio);
      }
    }
  }
  for (const auto& [scenario, by_model] : best) {
    double lowest = INFINITY;
    for (const auto& [model, ratio] : by_model) {
      json.push_back(absl::StrFormat("\"best_%s_vs_loopback_%s\":%.4f",
                                     scenario, model, ratio));
      lowest = std::min(lowest, ratio);
    }
    json.push_back(
        absl::StrFormat("\"best_%s_vs_loopback\":%.4f", scenario, lowest));
  }
  std::printf("{%s}\n", absl::StrJoin(json, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
