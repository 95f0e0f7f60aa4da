// A scheduler and three worker processes on loopback: jobs submitted over
// REST and gRPC complete and match the in-process trainer; pause/resume;
// bad input; a killed worker turns LOST; a SIGKILLed scheduler restarts
// with its jobs and workers; every /metrics passes promtool.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "tests/scheduler_cluster.h"

namespace pipetrain::testing {
namespace {

using testing_http::Send;

TEST_F(SchedulerTest, JobsSubmittedOverRestAndGrpcCompleteLikeTheReference) {
  const v1::TrainingSpec spec = MlpSpec(12);
  const ReferenceRun ref = TrainInProcess(spec);
  const double ref_loss = ref.losses.back();
  const EvalReport& ref_eval = ref.eval;

  v1::JobSpec job_spec;
  *job_spec.mutable_training() = spec;
  job_spec.set_num_stages(3);
  // Over REST.
  auto posted =
      Send(scheduler_.http_port, "POST", "/v1/jobs", ToJsonString(job_spec));
  ASSERT_TRUE(posted.ok()) << posted.status();
  ASSERT_EQ(posted->status, 200) << posted->body;
  v1::Job rest_job;
  ASSERT_TRUE(ParseJson(posted->body, &rest_job).ok()) << posted->body;
  v1::Job done = WaitForState(rest_job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), 12);
  EXPECT_NEAR(done.loss(), ref_loss, 1e-5 * ref_loss);
  EXPECT_EQ(done.eval().samples(), 10000);
  EXPECT_NEAR(done.eval().loss(), ref_eval.loss, 1e-4 * ref_eval.loss);
  EXPECT_NEAR(done.eval().accuracy(), ref_eval.accuracy, 1e-3);
  auto fetched = Send(scheduler_.http_port, "GET", "/v1/jobs/" + rest_job.id());
  ASSERT_TRUE(fetched.ok());
  EXPECT_EQ(fetched->status, 200);
  EXPECT_NE(fetched->body.find("JOB_STATE_COMPLETED"), std::string::npos)
      << fetched->body;
  auto plan =
      Send(scheduler_.http_port, "GET", "/v1/jobs/" + rest_job.id() + "/plan");
  ASSERT_TRUE(plan.ok());
  v1::Plan p;
  ASSERT_TRUE(ParseJson(plan->body, &p).ok()) << plan->body;
  EXPECT_EQ(p.stages_size(), 3);
  auto versions = Send(scheduler_.http_port, "GET",
                       "/v1/jobs/" + rest_job.id() + "/versions");
  ASSERT_TRUE(versions.ok());
  v1::GetVersionsResponse v;
  ASSERT_TRUE(ParseJson(versions->body, &v).ok()) << versions->body;
  EXPECT_EQ(v.committed_version(), 12);
  EXPECT_EQ(v.history_size(), 3 * 12);

  // Over gRPC.
  v1::SubmitJobRequest q;
  *q.mutable_spec() = job_spec;
  v1::Job grpc_job;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(10));
    ASSERT_TRUE(scheduler_.stub->SubmitJob(&ctx, q, &grpc_job).ok());
  }
  done = WaitForState(grpc_job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_NEAR(done.loss(), ref_loss, 1e-5 * ref_loss);
  // Every worker is idle again.
  EXPECT_TRUE(WaitForWorkers(3, v1::WORKER_STATE_IDLE, 5));
}

TEST_F(SchedulerTest, InterleavedJobsMatchTheReference) {
  const v1::TrainingSpec spec = MlpSpec(8);
  const double ref_loss = TrainInProcess(spec).losses.back();
  v1::SubmitJobRequest q;
  *q.mutable_spec()->mutable_training() = spec;
  q.mutable_spec()->set_num_stages(2);
  q.mutable_spec()->set_schedule(v1::SCHEDULE_INTERLEAVED);
  q.mutable_spec()->set_virtual_stages(2);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(scheduler_.stub->SubmitJob(&ctx, q, &job).ok());
  }
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_NEAR(done.loss(), ref_loss, 1e-5 * ref_loss);
  grpc::ClientContext ctx;
  v1::GetPlanRequest pq;
  pq.set_job_id(job.id());
  v1::Plan plan;
  ASSERT_TRUE(scheduler_.stub->GetPlan(&ctx, pq, &plan).ok());
  ASSERT_EQ(plan.stages_size(), 2);
  EXPECT_EQ(plan.stages(0).chunks_size(), 2);
  EXPECT_EQ(plan.stages(1).chunks_size(), 2);
}

TEST_F(SchedulerTest, PauseHoldsTheStepAndResumeFinishes) {
  v1::SubmitJobRequest q;
  *q.mutable_spec()->mutable_training() = MlpSpec(400);
  q.mutable_spec()->set_num_stages(2);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(scheduler_.stub->SubmitJob(&ctx, q, &job).ok());
  }
  ASSERT_EQ(WaitForState(job.id(), v1::JOB_STATE_RUNNING).state(),
            v1::JOB_STATE_RUNNING);
  while (GetJob(job.id()).step() < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto paused =
      Send(scheduler_.http_port, "POST", "/v1/jobs/" + job.id() + ":pause");
  ASSERT_TRUE(paused.ok());
  ASSERT_EQ(paused->status, 200) << paused->body;
  // The stages finish the step in flight and report it in a heartbeat;
  // on a loaded machine that can take a while, so wait (up to 30 s) for
  // the step to stop moving before checking that it stays put.
  int64_t held = GetJob(job.id()).step();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    const int64_t now = GetJob(job.id()).step();
    if (now == held) break;
    held = now;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const v1::Job still = GetJob(job.id());
  EXPECT_EQ(still.state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(still.step(), held);
  EXPECT_LT(held, 400);
  auto resumed =
      Send(scheduler_.http_port, "POST", "/v1/jobs/" + job.id() + ":resume");
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->status, 200) << resumed->body;
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), 400);
}

TEST_F(SchedulerTest, BadInputGetsTheRightCodesAndTheSchedulerKeepsServing) {
  struct Case {
    const char* what;
    std::string method, path, body;
    int http;
    const char* needle;
  };
  v1::JobSpec bad_spec;
  *bad_spec.mutable_training() = MlpSpec(5);
  bad_spec.mutable_training()
      ->mutable_model()
      ->mutable_layers(2)
      ->mutable_linear()
      ->set_in_features(3);
  v1::JobSpec too_many;
  *too_many.mutable_training() = MlpSpec(5);
  too_many.set_num_stages(5);
  const std::vector<Case> cases = {
      {"malformed JSON", "POST", "/v1/jobs", "{\"training\": ", 400, "JSON"},
      {"unknown field", "POST", "/v1/jobs", "{\"trainingz\": {}}", 400,
       "trainingz"},
      {"unknown job", "GET", "/v1/jobs/job-999", "", 404, "job-999"},
      {"unknown action", "POST", "/v1/jobs/job-1:explode", "", 404, "explode"},
      {"invalid spec", "POST", "/v1/jobs", ToJsonString(bad_spec), 400,
       "layers[2].linear.in_features"},
      {"too many stages", "POST", "/v1/jobs", ToJsonString(too_many), 400,
       "needs 5 workers"},
  };
  for (const Case& c : cases) {
    auto r = Send(scheduler_.http_port, c.method, c.path, c.body);
    ASSERT_TRUE(r.ok()) << c.what;
    EXPECT_EQ(r->status, c.http) << c.what << ": " << r->body;
    EXPECT_NE(r->body.find(c.needle), std::string::npos)
        << c.what << ": " << r->body;
  }
  // The same calls over gRPC get the matching codes.
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest q;
    q.set_job_id("job-999");
    v1::Job r;
    EXPECT_EQ(scheduler_.stub->GetJob(&ctx, q, &r).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest q;
    *q.mutable_spec() = bad_spec;
    v1::Job r;
    const grpc::Status s = scheduler_.stub->SubmitJob(&ctx, q, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("layers[2].linear.in_features"),
              std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest q;
    *q.mutable_spec() = too_many;
    v1::Job r;
    EXPECT_EQ(scheduler_.stub->SubmitJob(&ctx, q, &r).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  auto workers = Send(scheduler_.http_port, "GET", "/v1/workers");
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->status, 200);
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(ParseJson(workers->body, &listed).ok()) << workers->body;
  EXPECT_EQ(listed.workers_size(), 3);
}

TEST_F(SchedulerTest, LostWorkersAndARestartedScheduler) {
  // A job that completes, so the restarted scheduler has something to list.
  v1::SubmitJobRequest q;
  *q.mutable_spec()->mutable_training() = MlpSpec(3);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(scheduler_.stub->SubmitJob(&ctx, q, &job).ok());
  }
  ASSERT_EQ(WaitForState(job.id(), v1::JOB_STATE_COMPLETED).state(),
            v1::JOB_STATE_COMPLETED);

  workers_[2].process->Signal(SIGKILL);
  ASSERT_TRUE(WaitForWorkers(1, v1::WORKER_STATE_LOST, 10));

  scheduler_.process->Signal(SIGKILL);
  auto again = StartScheduler(
      dir_.path(), {"--lease_seconds=1.5", "--heartbeat_seconds=0.2"});
  ASSERT_TRUE(again.ok()) << again.status();
  scheduler_ = std::move(*again);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(5));
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(
      scheduler_.stub->ListJobs(&ctx, v1::ListJobsRequest(), &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).id(), job.id());
  EXPECT_EQ(jobs.jobs(0).state(), v1::JOB_STATE_COMPLETED);
  const v1::ListWorkersResponse known = ListWorkers();
  EXPECT_EQ(known.workers_size(), 3);
}

TEST_F(SchedulerTest, EveryMetricsEndpointPassesPromtool) {
  std::vector<std::pair<std::string, int>> endpoints = {
      {"scheduler", scheduler_.http_port}};
  for (size_t i = 0; i < workers_.size(); ++i) {
    endpoints.push_back(
        {absl::StrCat("worker", i), workers_[i].process->port("metrics")});
  }
  // Traffic first, so labelled families have samples.
  v1::SubmitJobRequest q;
  *q.mutable_spec()->mutable_training() = MlpSpec(2);
  q.mutable_spec()->set_num_stages(3);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(scheduler_.stub->SubmitJob(&ctx, q, &job).ok());
  }
  ASSERT_EQ(WaitForState(job.id(), v1::JOB_STATE_COMPLETED).state(),
            v1::JOB_STATE_COMPLETED);
  for (const auto& [name, port] : endpoints) {
    auto r = Send(port, "GET", "/metrics");
    ASSERT_TRUE(r.ok()) << name;
    ASSERT_EQ(r->status, 200) << name;
    const std::string path = dir_.path() + "/" + name + ".prom";
    std::ofstream(path) << r->body;
    const std::string command = "promtool check metrics < " + path + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buf[512];
    while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
    EXPECT_EQ(pclose(pipe), 0) << name << ":\n" << output;
    EXPECT_NE(r->body.find("pipetrain_"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace pipetrain::testing
