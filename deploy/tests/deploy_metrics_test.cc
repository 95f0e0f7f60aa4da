// The metrics the Grafana dashboard and the Prometheus alert rules select
// are ones the services export. A scheduler and two workers run a job on
// loopback (and answer one failing control call, so the error counter has
// a sample); their /metrics are scraped while the job runs, and
// promql_check.py checks every selector of the dashboard and the alert
// rules (metric names, label="value" matchers, grouping labels) against
// those scrapes; `promtool check metrics` parses and lints each scrape. The
// gauges added for the dashboard carry real values.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "tests/cluster_harness.h"

namespace pipetrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Value of the first sample whose line starts with `series` + ' ', or -1e300.
double SampleValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value))
        return value;
    }
  }
  return -1e300;
}

// Runs `command`, returns its exit status and output.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) *output += buf;
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class DeployMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StartScheduler(dir_.path(),
                            {"--lease_seconds=2", "--heartbeat_seconds=0.2"});
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
    for (int i = 0; i < 2; ++i) {
      auto w = StartWorker({"--scheduler=" + scheduler_.address,
                            "--labels=zone=z" + std::to_string(i)});
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(std::move(*w));
    }
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (IdleWorkers() < 2 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(IdleWorkers(), 2);
  }

  int IdleWorkers() {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    v1::ListWorkersResponse r;
    if (!scheduler_.stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &r).ok())
      return 0;
    int n = 0;
    for (const auto& w : r.workers()) n += w.state() == v1::WORKER_STATE_IDLE;
    return n;
  }

  v1::Job GetJob(const std::string& id, grpc::Status* status = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    v1::GetJobRequest q;
    q.set_job_id(id);
    v1::Job job;
    const grpc::Status s = scheduler_.stub->GetJob(&ctx, q, &job);
    if (status != nullptr) *status = s;
    return job;
  }

  // Scrapes /metrics on `port` into dir_/name.prom and returns the text.
  std::string Scrape(const std::string& name, int port) {
    auto r = testing_http::Send(port, "GET", "/metrics");
    EXPECT_TRUE(r.ok()) << name << ": " << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(r->status, 200) << name;
    const std::string path = dir_.path() + "/" + name + ".prom";
    std::ofstream(path) << r->body;
    scrapes_.push_back(path);
    return r->body;
  }

  TempDir dir_;
  Scheduler scheduler_;
  std::vector<Worker> workers_;
  std::vector<std::string> scrapes_;
};

TEST_F(DeployMetricsTest, DashboardAndAlertsSelectOnlyExportedMetrics) {
  v1::TrainingSpec training;
  ASSERT_TRUE(
      ReadJsonFile(SourcePath("examples/fashion_mnist_mlp.job.json"), &training)
          .ok());
  training.set_steps(100000);  // cancelled once scraped
  training.set_epochs(0);
  training.set_eval_every(0);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec()->mutable_training() = training;
  submit.mutable_spec()->set_num_stages(2);
  submit.mutable_spec()->set_schedule(v1::SCHEDULE_GPIPE);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(10));
    ASSERT_TRUE(scheduler_.stub->SubmitJob(&ctx, submit, &job).ok());
  }
  // Running, with a few steps done and the versions committed.
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  v1::Job now;
  while (Clock::now() < deadline) {
    now = GetJob(job.id());
    if (now.state() == v1::JOB_STATE_FAILED) break;
    if (now.state() == v1::JOB_STATE_RUNNING && now.committed_version() >= 5)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(now.state(), v1::JOB_STATE_RUNNING) << now.error();
  ASSERT_GE(now.committed_version(), 5);
  // One control call that fails: the error counter gets a sample.
  grpc::Status missing;
  GetJob("job-does-not-exist", &missing);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);

  const std::string scheduler_text = Scrape("scheduler", scheduler_.http_port);
  EXPECT_GE(
      SampleValue(scheduler_text,
                  absl::StrCat("pipetrain_scheduler_committed_version{job=\"",
                               job.id(), "\"}")),
      5);
  for (size_t i = 0; i < workers_.size(); ++i) {
    const std::string text =
        Scrape(absl::StrCat("worker", i), workers_[i].process->port("metrics"));
    // GPipe with K = 2 stages and M = 4 micro-batches idles
    // (K-1)(F+B) / (M(F+B) + (K-1)(F+B)) = 3 / 15 of a step in theory.
    EXPECT_NEAR(SampleValue(text, "pipetrain_stage_theoretical_bubble"), 0.2,
                1e-9)
        << "worker " << i;
    // The CPU backend reports the worker's resident set: megabytes at least.
    EXPECT_GT(SampleValue(
                  text, "pipetrain_stage_device_memory_bytes{device=\"cpu\"}"),
              1e6)
        << "worker " << i;
    EXPECT_GE(SampleValue(text, "pipetrain_stage_index"), 0) << "worker " << i;
  }

  std::string command = absl::StrCat("/usr/bin/python3 ",
                                     SourcePath("deploy/tests/promql_check.py"),
                                     " names --scrape");
  for (const std::string& path : scrapes_) absl::StrAppend(&command, " ", path);
  absl::StrAppend(&command, " --dashboard ",
                  SourcePath("deploy/grafana/dashboards/pipetrain.json"),
                  " --rules ", SourcePath("deploy/prometheus/alerts.yml"));
  std::string output;
  EXPECT_EQ(RunCommand(command, &output), 0) << command << "\n" << output;
  std::printf("%s", output.c_str());
  // Prometheus' own parser and linter accept every live exposition.
  for (const std::string& path : scrapes_) {
    std::string lint;
    EXPECT_EQ(RunCommand("promtool check metrics < " + path, &lint), 0)
        << path << "\n"
        << lint;
  }

  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  v1::JobActionRequest cancel;
  cancel.set_job_id(job.id());
  v1::Job cancelled;
  EXPECT_TRUE(scheduler_.stub->CancelJob(&ctx, cancel, &cancelled).ok());
}

}  // namespace
}  // namespace pipetrain::testing
