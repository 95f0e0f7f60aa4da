#include "services/ctl/views.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/ctl/job_input.h"
#include "services/ctl/progress_bar.h"
#include "services/ctl/text_table.h"

namespace pipetrain {
namespace ctl {
namespace {

// Width of the key column in key/value views ("throughput:" plus a space).
constexpr int kKeyWidth = 12;

void AppendField(const std::string& key, const std::string& value,
                 std::string* out) {
  absl::StrAppendFormat(out, "%-*s%s\n", kKeyWidth, key + ":", value);
}

// "5m00s ago"; "-" when the time is unknown (0).
std::string Age(int64_t unix_ms, int64_t now_unix_ms) {
  if (unix_ms <= 0) return "-";
  return HumanizeDuration((now_unix_ms - unix_ms) / 1000.0) + " ago";
}

std::string Percent(double fraction) {
  return absl::StrFormat("%.0f%%", 100 * fraction);
}

std::string StepOf(const v1::Job& job) {
  return absl::StrCat(job.step(), "/", job.total_steps());
}

std::string ProgressPercent(const v1::Job& job) {
  if (job.total_steps() <= 0) return "-";
  return absl::StrCat(job.step() * 100 / job.total_steps(), "%");
}

// "4", "0-3"; "-" for an empty range.
std::string RangeText(int begin, int end) {
  if (end <= begin) return "-";
  if (end == begin + 1) return absl::StrCat(begin);
  return absl::StrCat(begin, "-", end - 1);
}

// The layers a stage's worker holds: its range, or its chunks under the
// interleaved schedule ("0-1,4-5").
std::string LayersOf(const v1::PlannedStage& s) {
  if (s.chunks_size() == 0) return RangeText(s.layer_begin(), s.layer_end());
  std::string out;
  for (const v1::LayerRange& r : s.chunks()) {
    absl::StrAppend(&out, out.empty() ? "" : ",",
                    RangeText(r.begin(), r.end()));
  }
  return out;
}

std::string BytesOrDash(int64_t bytes) {
  return bytes > 0 ? HumanizeBytes(bytes) : "-";
}

std::string ScheduleSummary(const v1::Job& job) {
  const v1::JobSpec& spec = job.spec();
  const int stages =
      job.stages_size() > 0 ? job.stages_size() : spec.num_stages();
  std::string out = ScheduleName(spec.schedule());
  absl::StrAppend(&out, ", ",
                  stages > 0 ? absl::StrCat(stages, " stages")
                             : std::string("stages chosen by the planner"));
  absl::StrAppend(&out, ", wire ", WireName(spec.wire_dtype()));
  const v1::TrainingSpec& t = spec.training();
  if (t.batch_size() > 0) absl::StrAppend(&out, ", batch ", t.batch_size());
  if (t.micro_batches() > 1) {
    absl::StrAppend(&out, " in ", t.micro_batches(), " micro-batches");
  }
  return out;
}

std::string StagesTable(const v1::Job& job) {
  TextTable table({{"STAGE", true},
                   {"WORKER"},
                   {"STEP", true},
                   {"VERSION", true},
                   {"BUSY", true},
                   {"FORWARD", true},
                   {"BACKWARD", true},
                   {"PEAK ACT", true}});
  for (const v1::StageProgress& s : job.stages()) {
    table.AddRow({absl::StrCat(s.stage()), s.worker_id(),
                  absl::StrCat(s.next_step()), absl::StrCat(s.weight_version()),
                  Percent(s.busy_fraction()),
                  FormatSeconds(s.forward_seconds()),
                  FormatSeconds(s.backward_seconds()),
                  BytesOrDash(s.peak_activation_bytes())});
  }
  return table.Render();
}

// The latest evaluations, oldest first.
std::string EvaluationsTable(const v1::Job& job) {
  TextTable table({{"EVAL STEP", true},
                   {"LOSS", true},
                   {"ACCURACY", true},
                   {"SAMPLES", true}});
  const int n = job.evaluations_size();
  for (int i = std::max(0, n - kMaxEvaluationRows); i < n; ++i) {
    const v1::EvalResult& e = job.evaluations(i);
    table.AddRow({absl::StrCat(e.step()), absl::StrFormat("%.4f", e.loss()),
                  absl::StrFormat("%.1f%%", 100 * e.accuracy()),
                  absl::StrCat(e.samples())});
  }
  std::string out = table.Render();
  if (n > kMaxEvaluationRows) {
    absl::StrAppend(&out, "(last ", kMaxEvaluationRows, " of ", n,
                    " evaluations)\n");
  }
  return out;
}

// The latest events, oldest first.
std::string EventsTable(const v1::Job& job, int64_t now_unix_ms) {
  TextTable table({{"WHEN"},
                   {"EVENT"},
                   {"STEP", true},
                   {"VERSION", true},
                   {"TIME", true},
                   {"DETAIL"}});
  const int n = job.events_size();
  for (int i = std::max(0, n - kMaxEventRows); i < n; ++i) {
    const v1::JobEvent& e = job.events(i);
    table.AddRow({Age(e.unix_ms(), now_unix_ms), EventKindName(e.kind()),
                  absl::StrCat(e.step()), absl::StrCat(e.version()),
                  e.seconds() > 0 ? FormatSeconds(e.seconds()) : "-",
                  e.message()});
  }
  std::string out = table.Render();
  if (n > kMaxEventRows) {
    absl::StrAppend(&out, "(last ", kMaxEventRows, " of ", n, " events)\n");
  }
  return out;
}

std::string ProgressField(const v1::Job& job) {
  std::string out = absl::StrCat(StepOf(job), " steps");
  if (job.total_steps() > 0)
    absl::StrAppend(&out, " (", ProgressPercent(job), ")");
  absl::StrAppend(&out, ", epoch ", job.epoch());
  return out;
}

}  // namespace

std::string FormatSeconds(double seconds) {
  if (seconds < 0.01) return absl::StrFormat("%.2f ms", seconds * 1e3);
  if (seconds < 1) return absl::StrFormat("%.1f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::string FormatJobsTable(const v1::ListJobsResponse& jobs,
                            int64_t now_unix_ms) {
  if (jobs.jobs_size() == 0) return "no jobs\n";
  TextTable table({{"ID"},
                   {"NAME"},
                   {"STATE"},
                   {"STEP", true},
                   {"PROGRESS", true},
                   {"LOSS", true},
                   {"ACC", true},
                   {"SAMPLES/S", true},
                   {"STAGES", true},
                   {"AGE", true}});
  for (const v1::Job& job : jobs.jobs()) {
    const bool stepped = job.step() > 0;
    table.AddRow(
        {job.id(), job.name().empty() ? "-" : job.name(),
         JobStateName(job.state()), StepOf(job), ProgressPercent(job),
         stepped ? absl::StrFormat("%.4f", job.loss()) : "-",
         stepped ? absl::StrFormat("%.1f%%", 100 * job.accuracy()) : "-",
         stepped ? absl::StrFormat("%.0f", job.samples_per_second()) : "-",
         job.stages_size() > 0 ? absl::StrCat(job.stages_size()) : "-",
         job.created_unix_ms() > 0
             ? HumanizeDuration((now_unix_ms - job.created_unix_ms()) / 1e3)
             : "-"});
  }
  return table.Render();
}

std::string FormatWorkersTable(const v1::ListWorkersResponse& workers,
                               int64_t now_unix_ms) {
  if (workers.workers_size() == 0) return "no workers registered\n";
  TextTable table({{"ID"},
                   {"ADDRESS"},
                   {"STATE"},
                   {"DEVICE"},
                   {"ZONE"},
                   {"GFLOP/S", true},
                   {"MEMORY", true},
                   {"JOB/STAGE"},
                   {"HEARTBEAT", true}});
  for (const v1::WorkerInfo& w : workers.workers()) {
    const auto zone = w.labels().find("zone");
    std::string device = w.device().empty() ? w.device_kind() : w.device();
    if (w.cpu_limit_cores() > 0) {
      absl::StrAppend(&device,
                      absl::StrFormat(" (%.3g cores)", w.cpu_limit_cores()));
    }
    table.AddRow(
        {w.id(), w.address(), WorkerStateName(w.state()), device,
         zone == w.labels().end() ? "-" : zone->second,
         absl::StrFormat("%.1f", w.gemm_gflops()),
         BytesOrDash(w.memory_bytes()),
         w.job_id().empty() ? "-" : absl::StrCat(w.job_id(), "/", w.stage()),
         Age(w.last_heartbeat_unix_ms(), now_unix_ms)});
  }
  return table.Render();
}

std::string FormatBandwidth(double bytes_per_s) {
  const double bits = bytes_per_s * 8;
  if (bits >= 1e9) return absl::StrFormat("%.2f Gb/s", bits / 1e9);
  return absl::StrFormat("%.1f Mb/s", bits / 1e6);
}

std::string FormatLinksMatrix(const v1::ListWorkersResponse& workers) {
  if (workers.workers_size() == 0) return "no workers registered\n";
  std::vector<TextColumn> columns = {{"FROM \\ TO"}};
  for (const v1::WorkerInfo& w : workers.workers()) columns.push_back({w.id()});
  TextTable table(columns);
  bool overridden = false;
  for (const v1::WorkerInfo& from : workers.workers()) {
    std::vector<std::string> row = {from.id()};
    for (const v1::WorkerInfo& to : workers.workers()) {
      if (to.id() == from.id()) {
        row.push_back(".");
        continue;
      }
      const v1::LinkMeasurement* link = nullptr;
      for (const v1::LinkMeasurement& l : from.links()) {
        if (l.to_worker_id() == to.id()) link = &l;
      }
      if (link == nullptr || !(link->bandwidth_bytes_per_s() > 0)) {
        row.push_back("-");
        continue;
      }
      const bool is_override = link->source() == "override";
      overridden |= is_override;
      row.push_back(absl::StrFormat(
          "%s %s%s", FormatBandwidth(link->bandwidth_bytes_per_s()),
          absl::StrFormat("%.2f ms", link->rtt_seconds() * 1e3),
          is_override ? "*" : ""));
    }
    table.AddRow(row);
  }
  std::string out = table.Render();
  absl::StrAppend(&out,
                  "bandwidth and round-trip time from each row's worker to "
                  "each column's; - not measured\n");
  if (overridden) {
    absl::StrAppend(&out,
                    "* set by the scheduler's flags (--zone_bandwidth, "
                    "--zone_latency), not measured\n");
  }
  return out;
}

std::string FormatJobDetail(const v1::Job& job, int64_t now_unix_ms) {
  std::string out;
  AppendField("job",
              job.name().empty()
                  ? job.id()
                  : absl::StrCat(job.id(), " (", job.name(), ")"),
              &out);
  AppendField("state", JobStateName(job.state()), &out);
  AppendField("progress", ProgressField(job), &out);
  if (job.step() > 0) {
    AppendField("loss",
                absl::StrFormat("%.4f (train accuracy %.1f%%)", job.loss(),
                                100 * job.accuracy()),
                &out);
    AppendField("throughput",
                absl::StrFormat("%.0f samples/s", job.samples_per_second()),
                &out);
  }
  AppendField("schedule", ScheduleSummary(job), &out);
  AppendField("committed",
              absl::StrCat("weight version ", job.committed_version()), &out);
  AppendField(
      "created",
      absl::StrCat(Age(job.created_unix_ms(), now_unix_ms), ", updated ",
                   Age(job.updated_unix_ms(), now_unix_ms)),
      &out);
  if (job.has_eval() && job.eval().samples() > 0) {
    AppendField("eval", FormatEvalResult(job.eval()), &out);
    out.pop_back();  // FormatEvalResult's own newline.
  }
  if (!job.error().empty()) AppendField("error", job.error(), &out);
  if (job.stages_size() > 0) absl::StrAppend(&out, "\n", StagesTable(job));
  if (job.evaluations_size() > 1) {
    absl::StrAppend(&out, "\n", EvaluationsTable(job));
  }
  if (job.events_size() > 0) {
    absl::StrAppend(&out, "\n", EventsTable(job, now_unix_ms));
  }
  return out;
}

std::string FormatCheckpoints(const v1::ListCheckpointsResponse& checkpoints,
                              int64_t now_unix_ms) {
  if (checkpoints.checkpoints_size() == 0) return "no checkpoints\n";
  TextTable table({{"VERSION", true},
                   {"STEP", true},
                   {"SIZE", true},
                   {"LAYERS", true},
                   {"WRITTEN IN", true},
                   {"AGE"}});
  for (const v1::CheckpointInfo& c : checkpoints.checkpoints()) {
    table.AddRow(
        {absl::StrCat(c.version()), absl::StrCat(c.step()),
         BytesOrDash(c.bytes()), absl::StrCat(c.num_layers()),
         c.write_seconds() > 0 ? FormatSeconds(c.write_seconds()) : "-",
         Age(c.created_unix_ms(), now_unix_ms)});
  }
  return table.Render();
}

std::string EventKindName(v1::JobEventKind kind) {
  std::string name = v1::JobEventKind_Name(kind);
  if (name.empty()) return absl::StrCat("event ", static_cast<int>(kind));
  name = absl::AsciiStrToLower(name.substr(sizeof("JOB_EVENT_") - 1));
  std::replace(name.begin(), name.end(), '_', ' ');
  return name;
}

std::string FormatEventLine(const std::string& job_id,
                            const v1::JobEvent& event) {
  std::string out = absl::StrCat(job_id, " ", EventKindName(event.kind()),
                                 " at step ", event.step());
  if (!event.message().empty()) absl::StrAppend(&out, ": ", event.message());
  if (event.seconds() > 0) {
    absl::StrAppend(&out, " (", FormatSeconds(event.seconds()), ")");
  }
  return out;
}

std::string FormatPlan(const v1::Plan& plan) {
  std::string out = absl::StrFormat("plan for %s: %d stages, planned in %s\n",
                                    plan.job_id(), plan.stages_size(),
                                    FormatSeconds(plan.planning_seconds()));
  TextTable table({{"STAGE", true},
                   {"LAYERS"},
                   {"WORKER"},
                   {"ADDRESS"},
                   {"COMPUTE", true},
                   {"TRANSFER", true},
                   {"LINK", true},
                   {"RTT", true},
                   {"WIRE/MB", true},
                   {"MEMORY", true},
                   {"LIMIT", true}});
  for (const v1::PlannedStage& s : plan.stages()) {
    const bool link = s.link_bandwidth_bytes_per_s() > 0;
    table.AddRow(
        {absl::StrCat(s.stage()), LayersOf(s), s.worker_id(),
         s.worker_address(), FormatSeconds(s.compute_seconds()),
         FormatSeconds(s.transfer_seconds()),
         link ? FormatBandwidth(s.link_bandwidth_bytes_per_s()) : "-",
         link ? absl::StrFormat("%.2f ms", s.link_rtt_seconds() * 1e3) : "-",
         BytesOrDash(s.wire_bytes_per_micro_batch()),
         BytesOrDash(s.memory_bytes()), BytesOrDash(s.memory_limit_bytes())});
  }
  absl::StrAppend(&out, table.Render());
  std::string bottleneck =
      absl::StrFormat("stage %d, %s per micro-batch", plan.bottleneck_stage(),
                      FormatSeconds(plan.bottleneck_seconds()));
  if (plan.even_split_bottleneck_seconds() > 0) {
    absl::StrAppend(&bottleneck, " (even split: ",
                    FormatSeconds(plan.even_split_bottleneck_seconds()), ")");
  }
  AppendField("bottleneck", bottleneck, &out);
  AppendField("predicted",
              absl::StrFormat("step %s, bubble %.1f%%",
                              FormatSeconds(plan.predicted_step_seconds()),
                              100 * plan.predicted_bubble()),
              &out);
  if (plan.measured_steps() > 0 && plan.measured_step_seconds() > 0) {
    std::string measured = absl::StrFormat(
        "step %s (median of the last %d steps)",
        FormatSeconds(plan.measured_step_seconds()), plan.measured_steps());
    if (plan.predicted_step_seconds() > 0) {
      absl::StrAppendFormat(
          &measured, ", prediction error %+.1f%%",
          100 * (plan.predicted_step_seconds() / plan.measured_step_seconds() -
                 1));
    }
    AppendField("measured", measured, &out);
  } else {
    AppendField("measured", "- (no steps yet)", &out);
  }
  if (!plan.explanation().empty()) {
    absl::StrAppend(&out, "\n", plan.explanation());
    if (out.back() != '\n') out += '\n';
  }
  return out;
}

std::string FormatVersions(const v1::GetVersionsResponse& versions,
                           int64_t since_step, int64_t now_unix_ms,
                           size_t max_history) {
  std::string out =
      absl::StrCat("committed version ", versions.committed_version(), "\n");
  // The stash column only matters under asynchronous schedules.
  bool stashed = false;
  for (int32_t depth : versions.stage_stash_depths()) stashed |= depth > 0;
  std::vector<TextColumn> columns = {{"STAGE", true}, {"VERSION", true}};
  if (stashed) columns.push_back({"STASHED", true});
  TextTable stages(columns);
  for (int i = 0; i < versions.stage_versions_size(); ++i) {
    std::vector<std::string> row = {absl::StrCat(i),
                                    absl::StrCat(versions.stage_versions(i))};
    if (stashed) {
      row.push_back(absl::StrCat(i < versions.stage_stash_depths_size()
                                     ? versions.stage_stash_depths(i)
                                     : 0));
    }
    stages.AddRow(row);
  }
  if (stages.num_rows() > 0) absl::StrAppend(&out, stages.Render());
  const size_t total = versions.history_size();
  if (total == 0) {
    absl::StrAppend(&out, "no history since step ", since_step, "\n");
    return out;
  }
  const size_t shown = std::min(total, max_history);
  absl::StrAppend(&out, "\nhistory since step ", since_step);
  if (shown < total)
    absl::StrAppend(&out, " (last ", shown, " of ", total, ")");
  absl::StrAppend(&out, ":\n");
  TextTable history(
      {{"STAGE", true}, {"STEP", true}, {"VERSION", true}, {"AGE", true}});
  for (size_t i = total - shown; i < total; ++i) {
    const v1::VersionEntry& e = versions.history(static_cast<int>(i));
    history.AddRow({absl::StrCat(e.stage()), absl::StrCat(e.step()),
                    absl::StrCat(e.weight_version()),
                    Age(e.unix_ms(), now_unix_ms)});
  }
  absl::StrAppend(&out, history.Render());
  return out;
}

std::string FormatEvalResult(const v1::EvalResult& eval) {
  return absl::StrFormat(
      "test accuracy %.1f%% on %d samples (loss %.4f) at step %d\n",
      100 * eval.accuracy(), eval.samples(), eval.loss(), eval.step());
}

std::string FormatEvalLine(const std::string& job_id,
                           const v1::EvalResult& eval) {
  return absl::StrFormat(
      "%s evaluation at step %d: loss %.4f, test accuracy %.1f%% on %d "
      "samples",
      job_id, eval.step(), eval.loss(), 100 * eval.accuracy(), eval.samples());
}

std::string FormatJobState(const v1::Job& job) {
  return absl::StrCat(job.id(), " ", JobStateName(job.state()), " at step ",
                      StepOf(job), "\n");
}

}  // namespace ctl
}  // namespace pipetrain
