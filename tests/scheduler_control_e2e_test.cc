// The scheduler steering jobs in flight, end to end (a scheduler and three
// worker processes on loopback, as in scheduler_e2e_test.cc): a scheduler
// SIGKILLed and restarted while a job runs; cancelling a running job;
// evaluation on request of a paused job, and its Chrome trace; a SIGKILLed
// worker failing its job; an interleaved Transformer's final evaluation.
// Numbers are compared with the in-process trainer (LocalTrainer), each
// tolerance stated as absolute or relative.
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "tests/scheduler_cluster.h"

namespace pipetrain::testing {
namespace {

using Clock = std::chrono::steady_clock;
using testing_http::Send;

// Evaluations against the in-process trainer's, relative: the pipeline's
// weights equal the trainer's up to float summation order (1e-5), and the
// scheduler evaluates them with the trainer's own code.
constexpr double kEvalRel = 1e-5;

v1::JobSpec JobOf(const v1::TrainingSpec& training, int stages) {
  v1::JobSpec spec;
  *spec.mutable_training() = training;
  spec.set_num_stages(stages);
  return spec;
}

void ExpectEvalLike(const v1::EvalResult& got, const EvalReport& want,
                    const std::string& what) {
  EXPECT_EQ(got.samples(), want.samples) << what;
  EXPECT_NEAR(got.loss(), want.loss, kEvalRel * want.loss)
      << what << ": evaluation loss beyond relative tolerance " << kEvalRel;
  EXPECT_NEAR(got.accuracy(), want.accuracy, kEvalRel * want.accuracy)
      << what << ": accuracy beyond relative tolerance " << kEvalRel;
}

class SchedulerControlTest : public SchedulerTest {
 protected:
  // The stage of `job` on the worker at `address`, as the worker reports it.
  grpc::Status StageStatus(const std::string& address, const std::string& job,
                           v1::GetStatusResponse* out) {
    Worker* worker = WorkerAt(address);
    if (worker == nullptr) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "no worker " + address);
    }
    v1::GetStatusRequest request;
    request.set_job_id(job);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    return worker->stub->GetStatus(&ctx, request, out);
  }

  // Every stage of `id` as its worker reports it, in stage order.
  std::vector<v1::GetStatusResponse> Stages(const std::string& id) {
    std::vector<v1::GetStatusResponse> out;
    const v1::Plan plan = GetPlan(id);
    for (const v1::PlannedStage& s : plan.stages()) {
      v1::GetStatusResponse status;
      const grpc::Status rpc = StageStatus(s.worker_address(), id, &status);
      EXPECT_TRUE(rpc.ok())
          << "stage " << s.stage() << ": " << rpc.error_message();
      out.push_back(status);
    }
    return out;
  }

  static std::string Describe(const std::vector<v1::GetStatusResponse>& all) {
    std::string out;
    for (size_t s = 0; s < all.size(); ++s) {
      absl::StrAppend(&out, " stage ", s, " ",
                      v1::StageState_Name(all[s].state()), " at step ",
                      all[s].next_step(), " (", all[s].error(), ");");
    }
    return out;
  }

  grpc::Status Pause(const std::string& id) {
    auto r = Send(scheduler_.http_port, "POST", "/v1/jobs/" + id + ":pause");
    if (!r.ok()) return ToGrpcStatus(r.status());
    if (r->status != 200) {
      return grpc::Status(grpc::StatusCode::UNKNOWN,
                          absl::StrCat("HTTP ", r->status, ": ", r->body));
    }
    return grpc::Status::OK;
  }

  // Pauses `id`, then waits until the job is PAUSED and every stage reports
  // DONE at the same step (the weights are then those after that many
  // steps); returns the step (-1 when that does not happen within 10 s).
  int64_t PauseAndSettle(const std::string& id) {
    const grpc::Status paused = Pause(id);
    EXPECT_TRUE(paused.ok()) << paused.error_message();
    if (!paused.ok()) return -1;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    std::vector<v1::GetStatusResponse> stages;
    while (Clock::now() < deadline) {
      stages = Stages(id);
      std::set<int64_t> steps;
      bool done = true;
      for (const auto& s : stages) {
        done = done && s.state() == v1::STAGE_STATE_DONE;
        steps.insert(s.next_step());
      }
      if (done && steps.size() == 1 &&
          GetJob(id).state() == v1::JOB_STATE_PAUSED) {
        return *steps.begin();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // A stage left RUNNING here waits for a step that stage 0 will not run;
    // see APausedJobOutlastsTheReceiveTimeout.
    ADD_FAILURE() << id << ": the stages did not all stop at one step:"
                  << Describe(stages);
    return -1;
  }
};

// Expected today: the job's stages train on while the scheduler is away;
// the scheduler restarted on the same address and data directory lists the
// job with its spec, still RUNNING, and its workers ASSIGNED to it; their
// heartbeats reach it again, so it follows the job's progress and completes
// it, with the in-process trainer's final loss and evaluation.
TEST_F(SchedulerControlTest, ARestartWhileAJobRunsKeepsFollowingIt) {
  v1::TrainingSpec training = MlpSpec(500);
  training.set_eval_every(0);
  v1::JobSpec spec = JobOf(training, 2);
  spec.set_eval_samples(2000);
  const v1::Job job = Submit(spec);
  ASSERT_TRUE(WaitForStep(job.id(), 10)) << GetJob(job.id()).DebugString();
  const v1::Plan plan = GetPlan(job.id());
  ASSERT_EQ(plan.stages_size(), 2);

  const std::string port =
      scheduler_.address.substr(scheduler_.address.rfind(':') + 1);
  scheduler_.process->Signal(SIGKILL);
  std::vector<std::string> flags = SchedulerFlags();
  flags.push_back("--listen=127.0.0.1:" + port);  // where the workers dial
  auto again = StartScheduler(dir_.path(), flags);
  ASSERT_TRUE(again.ok()) << again.status();
  scheduler_ = std::move(*again);

  v1::ListJobsResponse jobs;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(5));
    ASSERT_TRUE(
        scheduler_.stub->ListJobs(&ctx, v1::ListJobsRequest(), &jobs).ok());
  }
  ASSERT_EQ(jobs.jobs_size(), 1);
  const v1::Job& listed = jobs.jobs(0);
  EXPECT_EQ(listed.id(), job.id());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(listed.spec(),
                                                                 job.spec()))
      << listed.spec().DebugString();
  EXPECT_EQ(listed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(listed.total_steps(), 500);
  const v1::ListWorkersResponse workers = ListWorkers();
  EXPECT_EQ(workers.workers_size(), 3);
  for (const v1::PlannedStage& s : plan.stages()) {
    bool assigned = false;
    for (const v1::WorkerInfo& w : workers.workers()) {
      assigned = assigned || (w.id() == s.worker_id() &&
                              w.state() == v1::WORKER_STATE_ASSIGNED &&
                              w.job_id() == job.id());
    }
    EXPECT_TRUE(assigned) << s.worker_id() << " not listed as assigned to "
                          << job.id() << ":\n"
                          << workers.DebugString();
  }

  const ReferenceRun ref = TrainInProcess(training, 500, 2000);
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), 500);
  EXPECT_NEAR(done.loss(), ref.losses.back(), 1e-5 * ref.losses.back())
      << "final loss beyond relative tolerance 1e-5";
  ExpectEvalLike(done.eval(), ref.eval, "final evaluation");
  EXPECT_TRUE(WaitForWorkers(3, v1::WORKER_STATE_IDLE, 10));
}

// Cancelling a running job: CANCELLED at once; its workers are IDLE again
// and hold no stage of it any more (GetStatus answers NOT_FOUND, or
// FAILED_PRECONDITION "no stage configured"), so nothing of it trains on.
TEST_F(SchedulerControlTest, CancellingARunningJobStopsItsStages) {
  const v1::Job job = Submit(JobOf(MlpSpec(100000), 2));
  ASSERT_TRUE(WaitForStep(job.id(), 3)) << GetJob(job.id()).DebugString();
  const v1::Plan plan = GetPlan(job.id());
  ASSERT_EQ(plan.stages_size(), 2);

  auto cancelled =
      Send(scheduler_.http_port, "POST", "/v1/jobs/" + job.id() + ":cancel");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;
  v1::Job answer;
  ASSERT_TRUE(ParseJson(cancelled->body, &answer).ok()) << cancelled->body;
  EXPECT_EQ(answer.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(GetJob(job.id()).state(), v1::JOB_STATE_CANCELLED);

  ASSERT_TRUE(WaitForWorkers(3, v1::WORKER_STATE_IDLE, 10))
      << ListWorkers().DebugString();
  const v1::ListWorkersResponse idle = ListWorkers();
  for (const v1::WorkerInfo& w : idle.workers()) {
    EXPECT_TRUE(w.job_id().empty()) << w.id() << " still on " << w.job_id();
  }
  for (const v1::PlannedStage& s : plan.stages()) {
    v1::GetStatusResponse status;
    const grpc::Status rpc = StageStatus(s.worker_address(), job.id(), &status);
    EXPECT_TRUE(rpc.error_code() == grpc::StatusCode::NOT_FOUND ||
                rpc.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
        << "stage " << s.stage() << " still there (" << rpc.error_message()
        << "): " << v1::StageState_Name(status.state()) << " at step "
        << status.next_step();
  }
  // An ended job cannot be resumed or cancelled again.
  auto resumed =
      Send(scheduler_.http_port, "POST", "/v1/jobs/" + job.id() + ":resume");
  ASSERT_TRUE(resumed.ok());
  EXPECT_NE(resumed->status, 200) << resumed->body;
}

// Evaluation on request, over REST and gRPC, of a job paused at step t
// equals the in-process trainer's evaluation after t steps.
TEST_F(SchedulerControlTest, EvaluatingAPausedJobMatchesTheTrainerAtItsStep) {
  const v1::TrainingSpec training = MlpSpec(400);
  const v1::Job job = Submit(JobOf(training, 3));
  ASSERT_TRUE(WaitForStep(job.id(), 4)) << GetJob(job.id()).DebugString();
  const int64_t step = PauseAndSettle(job.id());
  ASSERT_GT(step, 0);
  ASSERT_LT(step, 400);
  const ReferenceRun ref = TrainInProcess(training, step, 2000);

  auto rest =
      Send(scheduler_.http_port, "POST", "/v1/jobs/" + job.id() + ":evaluate",
           "{\"maxSamples\": 2000}");
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->status, 200) << rest->body;
  v1::EvalResult over_rest;
  ASSERT_TRUE(ParseJson(rest->body, &over_rest).ok()) << rest->body;
  EXPECT_EQ(over_rest.step(), step);
  ExpectEvalLike(over_rest, ref.eval, "REST :evaluate");

  v1::EvaluateRequest request;
  request.set_job_id(job.id());
  request.set_max_samples(2000);
  v1::EvalResult over_grpc;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(30));
  const grpc::Status rpc = scheduler_.stub->Evaluate(&ctx, request, &over_grpc);
  ASSERT_TRUE(rpc.ok()) << rpc.error_message();
  EXPECT_EQ(over_grpc.step(), step);
  ExpectEvalLike(over_grpc, ref.eval, "gRPC Evaluate");
  EXPECT_EQ(GetJob(job.id()).state(), v1::JOB_STATE_PAUSED);
}

// GET /v1/jobs/{id}/trace of a running job is valid JSON in the Chrome
// trace event format: one process (named by a metadata event) per stage,
// and every stage's forward (F) and backward (B) instructions as complete
// ("X") events.
TEST_F(SchedulerControlTest, TheChromeTraceHasAProcessPerStageWithFAndB) {
  const v1::Job job = Submit(JobOf(MlpSpec(100000), 3));
  ASSERT_TRUE(WaitForStep(job.id(), 4)) << GetJob(job.id()).DebugString();

  auto r = Send(scheduler_.http_port, "GET", "/v1/jobs/" + job.id() + "/trace");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  google::protobuf::Struct trace;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(r->body, &trace);
  ASSERT_TRUE(parsed.ok()) << "not JSON: " << parsed.ToString() << "\n"
                           << r->body.substr(0, 500);
  ASSERT_TRUE(trace.fields().count("traceEvents")) << r->body.substr(0, 500);
  std::map<int, std::string> processes;
  std::map<int, std::set<char>> kinds;
  int events = 0;
  for (const auto& v : trace.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    ASSERT_TRUE(f.count("ph") && f.count("pid") && f.count("name"))
        << v.DebugString();
    const int pid = static_cast<int>(f.at("pid").number_value());
    const std::string& name = f.at("name").string_value();
    if (f.at("ph").string_value() == "M" && name == "process_name") {
      EXPECT_TRUE(processes.emplace(pid, "").second)
          << "pid " << pid << " twice";
      processes[pid] =
          f.at("args").struct_value().fields().at("name").string_value();
    } else if (f.at("ph").string_value() == "X") {
      ++events;
      EXPECT_GE(f.at("dur").number_value(), 0) << v.DebugString();
      EXPECT_GT(f.at("ts").number_value(), 0) << v.DebugString();
      if (!name.empty()) kinds[pid].insert(name[0]);
    }
  }
  ASSERT_EQ(processes.size(), 3u) << r->body.substr(0, 500);
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(processes.count(s)) << "no process for stage " << s;
    EXPECT_TRUE(absl::StartsWith(processes[s], absl::StrCat("stage ", s)))
        << processes[s];
    EXPECT_TRUE(kinds[s].count('F')) << "stage " << s << " has no F event";
    EXPECT_TRUE(kinds[s].count('B')) << "stage " << s << " has no B event";
  }
  for (const auto& [pid, unused] : kinds) {
    EXPECT_TRUE(processes.count(pid)) << "events of an unnamed process " << pid;
  }
  EXPECT_GT(events, 0);
}

// Stages that wait at most 2 s for a neighbour's message.
class ShortReceiveTimeoutTest : public SchedulerControlTest {
 protected:
  ShortReceiveTimeoutTest() {
    extra_scheduler_flags_ = {"--stage_recv_timeout_seconds=2"};
  }
};

// A paused job stays paused: every stage stops at the step stage 0 stops
// at and reports DONE, none is left waiting for a micro-batch that never
// comes (which fails the job once the receive timeout passes), and the job
// resumes to its end. Pausing races with the stages' progress, so the test
// pauses and resumes three times; the job is long enough (a few thousand
// small steps) to be still running at every round's pause.
TEST_F(ShortReceiveTimeoutTest, APausedJobOutlastsTheReceiveTimeout) {
  constexpr int64_t kSteps = 3000;
  const v1::Job job = Submit(JobOf(MlpSpec(kSteps), 3));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "pause " << round);
    ASSERT_TRUE(WaitForStep(job.id(), GetJob(job.id()).step() + 4))
        << GetJob(job.id()).DebugString();
    const grpc::Status pause = Pause(job.id());
    ASSERT_TRUE(pause.ok()) << pause.error_message();
    // Twice the receive timeout.
    std::this_thread::sleep_for(std::chrono::seconds(4));
    const v1::Job paused = GetJob(job.id());
    ASSERT_EQ(paused.state(), v1::JOB_STATE_PAUSED) << paused.error();
    const std::vector<v1::GetStatusResponse> stages = Stages(job.id());
    for (const v1::GetStatusResponse& s : stages) {
      ASSERT_EQ(s.state(), v1::STAGE_STATE_DONE) << Describe(stages);
    }
    auto resumed =
        Send(scheduler_.http_port, "POST", "/v1/jobs/" + job.id() + ":resume");
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    ASSERT_EQ(resumed->status, 200) << resumed->body;
  }
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), kSteps);
}

// Without restarts (maxRestarts -1), a SIGKILLed worker fails its job; the
// reason names the lost worker, the survivors are IDLE again and the dead
// one is listed LOST. (Recovery: recovery_e2e_test.cc.)
TEST_F(SchedulerControlTest, AKilledWorkerFailsItsJobNamingTheWorker) {
  v1::TrainingSpec training = MlpSpec(100000);
  training.set_max_restarts(-1);
  const v1::Job job = Submit(JobOf(training, 3));
  ASSERT_TRUE(WaitForStep(job.id(), 3)) << GetJob(job.id()).DebugString();
  const v1::Plan plan = GetPlan(job.id());
  ASSERT_EQ(plan.stages_size(), 3);
  const v1::PlannedStage& victim = plan.stages(1);
  Worker* worker = WorkerAt(victim.worker_address());
  ASSERT_NE(worker, nullptr);
  worker->process->Signal(SIGKILL);

  const v1::Job failed = WaitForState(job.id(), v1::JOB_STATE_FAILED, 20);
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed.error().find(victim.worker_id()), std::string::npos)
      << "the reason does not name " << victim.worker_id() << ": "
      << failed.error();
  EXPECT_NE(failed.error().find("lost"), std::string::npos) << failed.error();
  EXPECT_TRUE(WaitForWorkers(2, v1::WORKER_STATE_IDLE, 10));
  EXPECT_TRUE(WaitForWorkers(1, v1::WORKER_STATE_LOST, 10));
}

// An interleaved character Transformer (K = 2 workers, v = 2 chunks each,
// so each worker holds two non-adjacent chunks) completes with the
// in-process trainer's final loss and evaluation. The scheduler must put
// the workers' weights back in layer order before evaluating.
TEST_F(SchedulerControlTest, AnInterleavedTransformerEvaluatesLikeTheTrainer) {
  const v1::TrainingSpec training = LoadSpec("char_transformer.job.json", 6);
  v1::JobSpec spec = JobOf(training, 2);
  spec.set_schedule(v1::SCHEDULE_INTERLEAVED);
  spec.set_virtual_stages(2);
  spec.set_eval_samples(256);
  const v1::Job job = Submit(spec);
  const ReferenceRun ref = TrainInProcess(training, 6, 256);
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  const v1::Plan plan = GetPlan(job.id());
  ASSERT_EQ(plan.stages_size(), 2);
  EXPECT_EQ(plan.stages(0).chunks_size(), 2);
  EXPECT_EQ(plan.stages(1).chunks_size(), 2);
  EXPECT_EQ(done.step(), 6);
  EXPECT_NEAR(done.loss(), ref.losses.back(), 1e-5 * ref.losses.back())
      << "training loss beyond relative tolerance 1e-5";
  EXPECT_TRUE(done.error().empty()) << done.error();
  ExpectEvalLike(done.eval(), ref.eval, "final evaluation");
}

}  // namespace
}  // namespace pipetrain::testing
