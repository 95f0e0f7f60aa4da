#include "services/ctl/commands.h"

#include <cstdio>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "google/protobuf/message.h"
#include "services/ctl/progress_bar.h"
#include "services/ctl/rpc_failure.h"
#include "services/ctl/scheduler_client.h"
#include "services/ctl/views.h"
#include "services/ctl/watch.h"

namespace pipetrain {
namespace ctl {
namespace {

// History entries `versions` prints in a table.
constexpr size_t kMaxHistoryRows = 20;

// What a command runs with. Borrowed pointers; lives for one command.
struct Invocation {
  SchedulerClient* client;    // borrowed
  const CtlOptions* options;  // borrowed
  // The command's argument: a job id or a file; empty when it takes none.
  std::string arg;
};

using Handler = std::function<absl::StatusOr<int>(const Invocation&)>;

struct Command {
  std::string name;
  // "JOB_ID", "JOB.json" or empty for none.
  std::string arg_name;
  Handler handler;
};

int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

// Prints the message as JSON with --output=json, `text` otherwise.
int Print(const Invocation& in, const google::protobuf::Message& message,
          const std::string& text) {
  const std::string out = in.options->json ? ToJson(message) + "\n" : text;
  std::fputs(out.c_str(), stdout);
  return 0;
}

absl::StatusOr<int> Watch(const Invocation& in, const std::string& job_id) {
  WatchOptions options;
  options.json = in.options->json;
  options.min_accuracy = in.options->min_accuracy;
  return WatchJob(in.client, job_id, options);
}

absl::StatusOr<int> Submit(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJob(in.arg, in.options->overrides));
  ASSIGN_OR_RETURN(v1::Job job, in.client->SubmitJob(spec));
  if (!in.options->watch) return Print(in, job, job.id() + "\n");
  if (!in.options->json) {
    std::printf("%s\n", job.id().c_str());
    std::fflush(stdout);
  }
  return Watch(in, job.id());
}

absl::StatusOr<int> Jobs(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::ListJobsResponse jobs, in.client->ListJobs());
  return Print(in, jobs, FormatJobsTable(jobs, NowUnixMs()));
}

absl::StatusOr<int> Workers(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::ListWorkersResponse workers, in.client->ListWorkers());
  if (in.options->links) return Print(in, workers, FormatLinksMatrix(workers));
  return Print(in, workers, FormatWorkersTable(workers, NowUnixMs()));
}

absl::StatusOr<int> Get(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::Job job, in.client->GetJob(in.arg));
  return Print(in, job, FormatJobDetail(job, NowUnixMs()));
}

absl::StatusOr<int> Plan(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::Plan plan, in.client->GetPlan(in.arg));
  return Print(in, plan, FormatPlan(plan));
}

absl::StatusOr<int> Versions(const Invocation& in) {
  const int64_t since = in.options->since_step;
  ASSIGN_OR_RETURN(v1::GetVersionsResponse versions,
                   in.client->GetVersions(in.arg, since));
  return Print(in, versions,
               FormatVersions(versions, since, NowUnixMs(), kMaxHistoryRows));
}

Handler JobAction(
    absl::StatusOr<v1::Job> (SchedulerClient::*action)(const std::string&)) {
  return [action](const Invocation& in) -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(v1::Job job, (in.client->*action)(in.arg));
    return Print(in, job, FormatJobState(job));
  };
}

absl::StatusOr<int> Evaluate(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::EvalResult eval,
                   in.client->Evaluate(in.arg, in.options->eval_samples));
  return Print(in, eval, FormatEvalResult(eval));
}

// Writes the job's recent pipeline trace as Chrome trace JSON.
absl::StatusOr<int> Trace(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::GetJobTraceResponse trace,
                   in.client->GetJobTrace(in.arg, in.options->trace_steps));
  const std::string& json = trace.chrome_trace_json();
  if (in.options->trace_out.empty()) {
    std::printf("%s\n", json.c_str());
    return 0;
  }
  FILE* f = std::fopen(in.options->trace_out.c_str(), "w");
  if (f == nullptr ||
      std::fwrite(json.data(), 1, json.size(), f) != json.size()) {
    if (f != nullptr) std::fclose(f);
    return absl::UnavailableError("cannot write " + in.options->trace_out);
  }
  std::fclose(f);
  std::printf("wrote %d events to %s (open in chrome://tracing or Perfetto)\n",
              trace.events_size(), in.options->trace_out.c_str());
  return 0;
}

absl::StatusOr<int> Checkpoints(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::ListCheckpointsResponse list,
                   in.client->ListCheckpoints(in.arg));
  return Print(in, list, FormatCheckpoints(list, NowUnixMs()));
}

absl::StatusOr<int> Checkpoint(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::CheckpointJobResponse r,
                   in.client->CheckpointJob(in.arg));
  return Print(in, r,
               absl::StrCat(in.arg, ": every stage snapshots at step ",
                            r.step(), "; `pipetrainctl checkpoints ", in.arg,
                            "` lists it once written\n"));
}

absl::StatusOr<int> RemoveWorker(const Invocation& in) {
  ASSIGN_OR_RETURN(v1::RemoveWorkerResponse r, in.client->RemoveWorker(in.arg));
  return Print(in, r, absl::StrCat("removed worker ", in.arg, "\n"));
}

// Writes a checkpoint's model export (safetensors) to --out.
absl::StatusOr<int> Export(const Invocation& in) {
  const std::string& path = in.options->trace_out;
  if (path.empty())
    return absl::InvalidArgumentError("export needs --out=FILE");
  ASSIGN_OR_RETURN(std::string bytes,
                   in.client->ExportModel(in.arg, in.options->export_version));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr ||
      std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    if (f != nullptr) std::fclose(f);
    return absl::UnavailableError("cannot write " + path);
  }
  if (std::fclose(f) != 0)
    return absl::UnavailableError("cannot write " + path);
  std::printf("wrote %zu bytes to %s\n", bytes.size(), path.c_str());
  return 0;
}

const std::vector<Command>& Commands() {
  static const auto* const kCommands = new std::vector<Command>{
      {"submit", "JOB.json", Submit},
      {"watch", "JOB_ID",
       [](const Invocation& in) { return Watch(in, in.arg); }},
      {"jobs", "", Jobs},
      {"workers", "", Workers},
      {"get", "JOB_ID", Get},
      {"plan", "JOB_ID", Plan},
      {"versions", "JOB_ID", Versions},
      {"pause", "JOB_ID", JobAction(&SchedulerClient::PauseJob)},
      {"resume", "JOB_ID", JobAction(&SchedulerClient::ResumeJob)},
      {"cancel", "JOB_ID", JobAction(&SchedulerClient::CancelJob)},
      {"evaluate", "JOB_ID", Evaluate},
      {"trace", "JOB_ID", Trace},
      {"checkpoints", "JOB_ID", Checkpoints},
      {"checkpoint", "JOB_ID", Checkpoint},
      {"export", "JOB_ID", Export},
      {"workers remove", "WORKER_ID", RemoveWorker},
  };
  return *kCommands;
}

// The usage problem with `args` for `command`, or empty when there is none.
std::string CheckArguments(const Command& command,
                           const std::vector<std::string>& args) {
  const size_t wanted = command.arg_name.empty() ? 1 : 2;
  if (args.size() < wanted) {
    return absl::StrCat(command.name, ": missing ", command.arg_name);
  }
  if (args.size() > wanted) {
    return absl::StrCat(command.name, ": unexpected argument '", args[wanted],
                        "'");
  }
  return "";
}

}  // namespace

int UsageError(const std::string& problem) {
  std::fprintf(stderr, "pipetrainctl: %s\n\n%s", problem.c_str(),
               UsageText().c_str());
  return kExitUsage;
}

std::string UsageText() {
  return R"(usage: pipetrainctl [flags] COMMAND [ARG]

Commands:
  submit JOB.json    submit a JobSpec or a bare TrainingSpec; prints the job id
                     [--watch] [--stages=N] [--schedule=gpipe|1f1b-flush]
                     [--wire=f32|bf16]
  watch JOB_ID       follow a job until it ends (exit 0 completed, 2 failed
                     or cancelled; Ctrl-C stops watching, not the job)
                     [--min_accuracy=A: exit 3 below that test accuracy]
  jobs               list jobs
  workers            list workers [--links: the measured link matrix]
  get JOB_ID         show a job and its stages
  plan JOB_ID        show the partition plan, its predicted costs and links,
                     and the measured step beside the predicted one
  versions JOB_ID    show weight versions [--since=STEP]
  pause JOB_ID       pause a job at a step boundary
  resume JOB_ID      resume a paused job
  cancel JOB_ID      cancel a job
  evaluate JOB_ID    evaluate on held-out data [--samples=N]
  trace JOB_ID       export the recent pipeline trace as Chrome trace JSON
                     [--steps=N] [--out=FILE]
  checkpoints JOB_ID list the job's committed checkpoints
  checkpoint JOB_ID  take a checkpoint now (training goes on)
  export JOB_ID      write a checkpoint's model as safetensors
                     --out=FILE [--version=V: default the latest]
  workers remove ID  forget a worker that left for good
  help               this text

Flags:
  --scheduler=HOST:PORT  scheduler address (default $PIPETRAIN_SCHEDULER,
                         else localhost:7000)
  --timeout=SECONDS      deadline of each call (default 10; evaluate waits
                         at least 300)
  --output=table|json    json prints the scheduler's answer as protobuf JSON
  --help                 all flags
)";
}

int RunCommand(const std::vector<std::string>& given,
               const CtlOptions& options) {
  if (given.empty()) return UsageError("no command given");
  // "workers remove ID" is one command of two words.
  std::vector<std::string> args = given;
  if (args.size() >= 2 && args[0] == "workers" && args[1] == "remove") {
    args.erase(args.begin() + 1);
    args[0] = "workers remove";
  }
  if (args[0] == "help") {
    std::fputs(UsageText().c_str(), stdout);
    return 0;
  }
  const Command* command = nullptr;
  for (const Command& c : Commands()) {
    if (c.name == args[0]) command = &c;
  }
  if (command == nullptr) {
    return UsageError(absl::StrCat("unknown command '", args[0], "'"));
  }
  const std::string problem = CheckArguments(*command, args);
  if (!problem.empty()) return UsageError(problem);

  SchedulerClient client(options.scheduler, options.timeout_seconds,
                         options.token);
  const Invocation in{&client, &options, args.size() > 1 ? args[1] : ""};
  const absl::StatusOr<int> code = command->handler(in);
  if (code.ok()) return *code;
  RpcFailureContext context;
  context.target = options.scheduler;
  context.job_id = command->arg_name == "JOB_ID" ? in.arg : "";
  context.connected = client.Connected();
  context.timeout_seconds = options.timeout_seconds;
  std::fprintf(stderr, "pipetrainctl: %s\n",
               DescribeRpcFailure(code.status(), context).c_str());
  return kExitError;
}

}  // namespace ctl
}  // namespace pipetrain
