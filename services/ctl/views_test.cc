#include "services/ctl/views.h"

#include <string>

#include "gtest/gtest.h"
#include "services/ctl/rpc_failure.h"
#include "services/ctl/text_table.h"

namespace pipetrain {
namespace ctl {
namespace {

constexpr int64_t kNow = 1'700'000'000'000;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

TEST(TextTable, AlignsColumnsAndTrimsTrailingSpaces) {
  TextTable table({{"NAME"}, {"N", true}, {"NOTE"}});
  table.AddRow({"a", "7", ""});
  table.AddRow({"longer", "1234"});  // The missing cell prints empty.
  EXPECT_EQ(table.Render(),
            "NAME       N  NOTE\n"
            "a          7\n"
            "longer  1234\n");
}

TEST(FormatJobDetail, EndsWithTheEventLog) {
  v1::Job job;
  job.set_id("job-3");
  job.set_state(v1::JOB_STATE_RUNNING);
  v1::JobEvent* lost = job.add_events();
  lost->set_kind(v1::JOB_EVENT_WORKER_LOST);
  lost->set_message("worker w-2 of stage 1 was lost");
  lost->set_step(42);
  lost->set_version(42);
  lost->set_unix_ms(kNow - 5'000);
  v1::JobEvent* back = job.add_events();
  back->set_kind(v1::JOB_EVENT_RECOVERED);
  back->set_message("resumed at step 40 from version 40");
  back->set_step(40);
  back->set_version(40);
  back->set_seconds(3.25);
  back->set_unix_ms(kNow - 1'000);
  const std::string detail = FormatJobDetail(job, kNow);
  const std::string table =
      "WHEN      EVENT        STEP  VERSION    TIME  DETAIL\n"
      "5.0s ago  worker lost    42       42       -  worker w-2 of stage 1 "
      "was lost\n"
      "1.0s ago  recovered      40       40  3.25 s  resumed at step 40 from "
      "version 40\n";
  ASSERT_GE(detail.size(), table.size());
  EXPECT_EQ(detail.substr(detail.size() - table.size()), table);
  EXPECT_EQ(EventKindName(v1::JOB_EVENT_REPLANNED), "replanned");
}

TEST(FormatCheckpoints, ListsVersionStepSizeAndAge) {
  v1::ListCheckpointsResponse list;
  EXPECT_EQ(FormatCheckpoints(list, kNow), "no checkpoints\n");
  v1::CheckpointInfo* c = list.add_checkpoints();
  c->set_version(40);
  c->set_step(40);
  c->set_bytes(3 * kMiB);
  c->set_num_layers(6);
  c->set_write_seconds(0.25);
  c->set_created_unix_ms(kNow - 2'000);
  EXPECT_EQ(FormatCheckpoints(list, kNow),
            "VERSION  STEP     SIZE  LAYERS  WRITTEN IN  AGE\n"
            "     40    40  3.0 MiB       6    250.0 ms  2.0s ago\n");
}

TEST(FormatSeconds, PicksPrecisionByMagnitude) {
  EXPECT_EQ(FormatSeconds(0), "0.00 ms");
  EXPECT_EQ(FormatSeconds(0.0021), "2.10 ms");
  EXPECT_EQ(FormatSeconds(0.1203), "120.3 ms");
  EXPECT_EQ(FormatSeconds(2.5), "2.50 s");
}

TEST(FormatJobsTable, OneRowPerJobWithDashesBeforeTheFirstStep) {
  v1::ListJobsResponse jobs;
  v1::Job* done = jobs.add_jobs();
  done->set_id("job-1");
  done->set_name("mlp");
  done->set_state(v1::JOB_STATE_COMPLETED);
  done->set_step(1875);
  done->set_total_steps(1875);
  done->set_loss(0.3123);
  done->set_accuracy(0.9);
  done->set_samples_per_second(2000);
  done->add_stages();
  done->add_stages();
  done->set_created_unix_ms(kNow - 3'900'000);
  v1::Job* pending = jobs.add_jobs();
  pending->set_id("job-2");
  pending->set_state(v1::JOB_STATE_PENDING);
  pending->set_created_unix_ms(kNow - 4'000);
  EXPECT_EQ(FormatJobsTable(jobs, kNow),
            "ID     NAME  STATE           STEP  PROGRESS    LOSS    ACC  "
            "SAMPLES/S  STAGES    AGE\n"
            "job-1  mlp   COMPLETED  1875/1875      100%  0.3123  90.0%       "
            "2000       2  1h05m\n"
            "job-2  -     PENDING          0/0         -       -      -       "
            "   -       -   4.0s\n");
  EXPECT_EQ(FormatJobsTable(v1::ListJobsResponse(), kNow), "no jobs\n");
}

TEST(FormatWorkersTable, ShowsDeviceCpuLimitZoneAssignmentAndHeartbeatAge) {
  v1::ListWorkersResponse workers;
  v1::WorkerInfo* cpu = workers.add_workers();
  cpu->set_id("w-1");
  cpu->set_address("10.0.0.5:7100");
  cpu->set_state(v1::WORKER_STATE_IDLE);
  cpu->set_device_kind("cpu");
  (*cpu->mutable_labels())["zone"] = "edge";
  cpu->set_gemm_gflops(85.3);
  cpu->set_cpu_limit_cores(1.5);
  cpu->set_memory_bytes(16 * kGiB);
  cpu->set_last_heartbeat_unix_ms(kNow - 1'200);
  v1::WorkerInfo* gpu = workers.add_workers();
  gpu->set_id("w-2");
  gpu->set_address("10.0.0.6:7100");
  gpu->set_state(v1::WORKER_STATE_ASSIGNED);
  gpu->set_device_kind("cuda");
  gpu->set_device("NVIDIA H100");
  gpu->set_gemm_gflops(51234.5);
  gpu->set_memory_bytes(80 * kGiB);
  gpu->set_job_id("job-3");
  gpu->set_stage(1);
  EXPECT_EQ(FormatWorkersTable(workers, kNow),
            "ID   ADDRESS        STATE     DEVICE           ZONE  GFLOP/S  "
            "MEMORY  JOB/STAGE  HEARTBEAT\n"
            "w-1  10.0.0.5:7100  IDLE      cpu (1.5 cores)  edge     85.3  "
            "16 GiB  -           1.2s ago\n"
            "w-2  10.0.0.6:7100  ASSIGNED  NVIDIA H100      -     51234.5  "
            "80 GiB  job-3/1            -\n");
  EXPECT_EQ(FormatWorkersTable(v1::ListWorkersResponse(), kNow),
            "no workers registered\n");
}

v1::Job TwoStageJob() {
  v1::Job job;
  job.set_id("job-3");
  job.set_name("mlp");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_step(1125);
  job.set_total_steps(1875);
  job.set_epoch(1);
  job.set_loss(0.4123);
  job.set_accuracy(0.852);
  job.set_samples_per_second(1830);
  job.mutable_spec()->set_schedule(v1::SCHEDULE_1F1B_FLUSH);
  job.mutable_spec()->set_wire_dtype(v1::DTYPE_BF16);
  job.mutable_spec()->mutable_training()->set_batch_size(64);
  job.mutable_spec()->mutable_training()->set_micro_batches(4);
  job.set_committed_version(1125);
  job.set_created_unix_ms(kNow - 300'000);
  job.set_updated_unix_ms(kNow - 400);
  struct Row {
    const char* worker;
    int64_t next_step;
    double busy, forward, backward;
    int64_t peak;
  };
  const Row rows[] = {{"w-1", 1126, 0.81, 0.0021, 0.0043, 12 * kMiB},
                      {"w-2", 1125, 0.77, 0.0030, 0.0061, 0}};
  for (const Row& r : rows) {
    v1::StageProgress* s = job.add_stages();
    s->set_stage(job.stages_size() - 1);
    s->set_worker_id(r.worker);
    s->set_next_step(r.next_step);
    s->set_weight_version(1125);
    s->set_busy_fraction(r.busy);
    s->set_forward_seconds(r.forward);
    s->set_backward_seconds(r.backward);
    s->set_peak_activation_bytes(r.peak);
  }
  return job;
}

TEST(FormatJobDetail, ListsFieldsThenStages) {
  EXPECT_EQ(
      FormatJobDetail(TwoStageJob(), kNow),
      "job:        job-3 (mlp)\n"
      "state:      RUNNING\n"
      "progress:   1125/1875 steps (60%), epoch 1\n"
      "loss:       0.4123 (train accuracy 85.2%)\n"
      "throughput: 1830 samples/s\n"
      "schedule:   1f1b-flush, 2 stages, wire bf16, batch 64 in 4 "
      "micro-batches\n"
      "committed:  weight version 1125\n"
      "created:    5m00s ago, updated 0.4s ago\n"
      "\n"
      "STAGE  WORKER  STEP  VERSION  BUSY  FORWARD  BACKWARD  PEAK ACT\n"
      "    0  w-1     1126     1125   81%  2.10 ms   4.30 ms    12 MiB\n"
      "    1  w-2     1125     1125   77%  3.00 ms   6.10 ms         -\n");
}

TEST(FormatJobDetail, ShowsEvalAndErrorWhenPresent) {
  v1::Job job;
  job.set_id("job-4");
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_error("worker w-2 lost");
  job.mutable_eval()->set_samples(2000);
  job.mutable_eval()->set_accuracy(0.5);
  job.mutable_eval()->set_loss(1.25);
  job.mutable_eval()->set_step(100);
  const std::string text = FormatJobDetail(job, kNow);
  EXPECT_NE(text.find("\neval:       test accuracy 50.0% on 2000 samples "
                      "(loss 1.2500) at step 100\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nerror:      worker w-2 lost\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpipe, stages chosen by the planner, wire f32\n"),
            std::string::npos)
      << text;
}

TEST(FormatJobDetail, ListsTheLatestEvaluationsWhenThereAreSeveral) {
  v1::Job job;
  job.set_id("job-5");
  job.set_state(v1::JOB_STATE_RUNNING);
  for (int i = 1; i <= kMaxEvaluationRows + 2; ++i) {
    v1::EvalResult* e = job.add_evaluations();
    e->set_step(50 * i);
    e->set_loss(2.0 / i);
    e->set_accuracy(0.05 * i);
    e->set_samples(500);
  }
  *job.mutable_eval() = job.evaluations(job.evaluations_size() - 1);
  const std::string text = FormatJobDetail(job, kNow);
  EXPECT_NE(text.find("\neval:       test accuracy 60.0% on 500 samples "
                      "(loss 0.1667) at step 600\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nEVAL STEP    LOSS  ACCURACY  SAMPLES\n"
                      "      150  0.6667     15.0%      500\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("      100  1.0000"), std::string::npos) << text;
  EXPECT_NE(text.find("      600  0.1667     60.0%      500\n"
                      "(last 10 of 12 evaluations)\n"),
            std::string::npos)
      << text;
  // One evaluation: the eval line says it all.
  job.mutable_evaluations()->DeleteSubrange(0, job.evaluations_size() - 1);
  EXPECT_EQ(FormatJobDetail(job, kNow).find("EVAL STEP"), std::string::npos);
}

TEST(FormatEvalLine, StepLossAccuracyAndSamples) {
  v1::EvalResult eval;
  eval.set_step(400);
  eval.set_loss(0.41234);
  eval.set_accuracy(0.852);
  eval.set_samples(10000);
  EXPECT_EQ(FormatEvalLine("job-3", eval),
            "job-3 evaluation at step 400: loss 0.4123, test accuracy 85.2% "
            "on 10000 samples");
}

TEST(FormatPlan, InterleavedStagesListTheirChunks) {
  v1::Plan plan;
  plan.set_job_id("job-6");
  for (int s = 0; s < 2; ++s) {
    v1::PlannedStage* stage = plan.add_stages();
    stage->set_stage(s);
    stage->set_worker_id("w-" + std::to_string(s + 1));
    for (int c = 0; c < 2; ++c) {
      v1::LayerRange* r = stage->add_chunks();
      r->set_begin(4 * c + 2 * s);
      r->set_end(4 * c + 2 * s + (s == 1 && c == 1 ? 1 : 2));
    }
  }
  const std::string text = FormatPlan(plan);
  EXPECT_NE(text.find("\n    0  0-1,4-5  w-1"), std::string::npos) << text;
  EXPECT_NE(text.find("\n    1  2-3,6    w-2"), std::string::npos) << text;
}

TEST(FormatPlan, TableThenBottleneckPredictionAndExplanation) {
  v1::Plan plan;
  plan.set_job_id("job-3");
  plan.set_planning_seconds(0.012);
  v1::PlannedStage* s0 = plan.add_stages();
  s0->set_stage(0);
  s0->set_layer_begin(0);
  s0->set_layer_end(4);
  s0->set_worker_id("w-1");
  s0->set_worker_address("10.0.0.5:7100");
  s0->set_compute_seconds(0.0124);
  s0->set_transfer_seconds(0.0012);
  s0->set_link_bandwidth_bytes_per_s(1.25e8);
  s0->set_link_rtt_seconds(0.0005);
  s0->set_wire_bytes_per_micro_batch(64 * 1024);
  s0->set_memory_bytes(3 * kGiB / 2);
  s0->set_memory_limit_bytes(16 * kGiB);
  v1::PlannedStage* s1 = plan.add_stages();
  s1->set_stage(1);
  s1->set_layer_begin(4);
  s1->set_layer_end(5);
  s1->set_worker_id("w-2");
  s1->set_worker_address("10.0.0.6:7100");
  s1->set_compute_seconds(0.0142);
  s1->set_memory_bytes(512 * kMiB);
  plan.set_bottleneck_stage(1);
  plan.set_bottleneck_seconds(0.0142);
  plan.set_even_split_bottleneck_seconds(0.0185);
  plan.set_predicted_step_seconds(0.1203);
  plan.set_predicted_bubble(0.182);
  plan.set_explanation("stage 1 holds the loss; w-2 is the faster worker");
  plan.set_measured_step_seconds(0.125);
  plan.set_measured_steps(20);
  EXPECT_EQ(
      FormatPlan(plan),
      "plan for job-3: 2 stages, planned in 12.0 ms\n"
      "STAGE  LAYERS  WORKER  ADDRESS        COMPUTE  TRANSFER       LINK "
      "     RTT  WIRE/MB   MEMORY   LIMIT\n"
      "    0  0-3     w-1     10.0.0.5:7100  12.4 ms   1.20 ms  1.00 Gb/s "
      " 0.50 ms   64 KiB  1.5 GiB  16 GiB\n"
      "    1  4       w-2     10.0.0.6:7100  14.2 ms   0.00 ms          - "
      "       -        -  512 MiB       -\n"
      "bottleneck: stage 1, 14.2 ms per micro-batch (even split: 18.5 "
      "ms)\n"
      "predicted:  step 120.3 ms, bubble 18.2%\n"
      "measured:   step 125.0 ms (median of the last 20 steps), "
      "prediction error -3.8%\n"
      "\n"
      "stage 1 holds the loss; w-2 is the faster worker\n");
}

TEST(FormatPlan, SaysWhenNoStepWasMeasuredYet) {
  v1::Plan plan;
  plan.set_job_id("job-4");
  plan.set_predicted_step_seconds(0.004);
  EXPECT_NE(FormatPlan(plan).find("measured:   - (no steps yet)\n"),
            std::string::npos)
      << FormatPlan(plan);
}

TEST(FormatLinksMatrix, BandwidthAndRttPerPairDashWhereUnmeasured) {
  v1::ListWorkersResponse workers;
  v1::WorkerInfo* a = workers.add_workers();
  a->set_id("w-1");
  v1::LinkMeasurement* ab = a->add_links();
  ab->set_to_worker_id("w-2");
  ab->set_bandwidth_bytes_per_s(1.5e9);  // 12 Gb/s
  ab->set_rtt_seconds(0.00012);
  ab->set_source("probe");
  v1::WorkerInfo* b = workers.add_workers();
  b->set_id("w-2");
  v1::LinkMeasurement* ba = b->add_links();
  ba->set_to_worker_id("w-1");
  ba->set_bandwidth_bytes_per_s(12.5e6);  // 100 Mb/s
  ba->set_rtt_seconds(0.1);
  ba->set_source("override");
  workers.add_workers()->set_id("w-3");
  EXPECT_EQ(FormatLinksMatrix(workers),
            "FROM \\ TO  w-1                    w-2                 w-3\n"
            "w-1        .                      12.00 Gb/s 0.12 ms  -\n"
            "w-2        100.0 Mb/s 100.00 ms*  .                   -\n"
            "w-3        -                      -                   .\n"
            "bandwidth and round-trip time from each row's worker to each "
            "column's; - not measured\n"
            "* set by the scheduler's flags (--zone_bandwidth, "
            "--zone_latency), not measured\n");
  EXPECT_EQ(FormatLinksMatrix(v1::ListWorkersResponse()),
            "no workers registered\n");
}

TEST(FormatVersions, ShowsCommittedPerStageAndTheLatestHistory) {
  v1::GetVersionsResponse versions;
  versions.set_committed_version(1200);
  versions.add_stage_versions(1203);
  versions.add_stage_versions(1201);
  const int64_t entries[][3] = {
      {0, 1198, 3000}, {1, 1199, 2000}, {0, 1200, 1000}};
  for (const auto& e : entries) {
    v1::VersionEntry* entry = versions.add_history();
    entry->set_stage(static_cast<int>(e[0]));
    entry->set_step(e[1]);
    entry->set_weight_version(e[1]);
    entry->set_unix_ms(kNow - e[2]);
  }
  EXPECT_EQ(FormatVersions(versions, 1000, kNow, 2),
            "committed version 1200\n"
            "STAGE  VERSION\n"
            "    0     1203\n"
            "    1     1201\n"
            "\n"
            "history since step 1000 (last 2 of 3):\n"
            "STAGE  STEP  VERSION       AGE\n"
            "    1  1199     1199  2.0s ago\n"
            "    0  1200     1200  1.0s ago\n");
  EXPECT_EQ(FormatVersions(v1::GetVersionsResponse(), 0, kNow, 20),
            "committed version 0\nno history since step 0\n");
}

TEST(FormatJobState, NamesTheStateAndStep) {
  v1::Job job = TwoStageJob();
  job.set_state(v1::JOB_STATE_PAUSED);
  EXPECT_EQ(FormatJobState(job), "job-3 PAUSED at step 1125/1875\n");
}

RpcFailureContext Context(bool connected, const std::string& job_id = "") {
  RpcFailureContext context;
  context.target = "localhost:7000";
  context.job_id = job_id;
  context.connected = connected;
  context.timeout_seconds = 10;
  return context;
}

TEST(DescribeRpcFailure, UnreachableSchedulerNamesTheAddress) {
  const std::string unreachable =
      "cannot reach the scheduler at localhost:7000 (is pipetrain-scheduler "
      "running? set --scheduler or PIPETRAIN_SCHEDULER)";
  EXPECT_EQ(DescribeRpcFailure(absl::UnavailableError("connection refused"),
                               Context(false)),
            unreachable);
  EXPECT_EQ(DescribeRpcFailure(absl::DeadlineExceededError("deadline"),
                               Context(false, "job-3")),
            unreachable);
}

TEST(DescribeRpcFailure, ConnectedSchedulerFailuresKeepTheirMessage) {
  EXPECT_EQ(DescribeRpcFailure(absl::DeadlineExceededError("deadline"),
                               Context(true)),
            "the scheduler at localhost:7000 did not answer within 10s "
            "(raise --timeout)");
  EXPECT_EQ(DescribeRpcFailure(absl::UnavailableError("no idle workers"),
                               Context(true)),
            "no idle workers (unavailable)");
  EXPECT_EQ(DescribeRpcFailure(
                absl::FailedPreconditionError("job job-3 is COMPLETED\nno"),
                Context(true, "job-3")),
            "job job-3 is COMPLETED; no (failed precondition)");
}

TEST(DescribeRpcFailure, WrongServerIsSuspected) {
  EXPECT_EQ(DescribeRpcFailure(absl::UnimplementedError(""), Context(true)),
            "the server at localhost:7000 does not serve this SchedulerService "
            "call (is --scheduler the gRPC address of a pipetrain-scheduler?)");
}

TEST(DescribeRpcFailure, MissingJobIsNamed) {
  EXPECT_EQ(DescribeRpcFailure(absl::NotFoundError("job job-9 not found"),
                               Context(true, "job-9")),
            "no job 'job-9'");
  EXPECT_EQ(DescribeRpcFailure(absl::NotFoundError(""), Context(true, "j")),
            "no job 'j'");
  EXPECT_EQ(DescribeRpcFailure(absl::NotFoundError("cannot open x.json"),
                               Context(false)),
            "cannot open x.json (not found)");
}

}  // namespace
}  // namespace ctl
}  // namespace pipetrain
