// Job specs: one validation for the scheduler and the CLI, naming the
// field; and the theoretical bubble of a job's schedule.
#include "spec/job_spec.h"

#include <cmath>

#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// Eight layers, batch 32 in M = 8 micro-batches, on `stages` stages.
v1::JobSpec Job(v1::ScheduleKindProto schedule, int stages) {
  v1::JobSpec job;
  const absl::Status status = ParseJson(R"({
    "training": {
      "model": {
        "inputKind": "INPUT_KIND_FLOAT", "inputShape": [4],
        "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
        "layers": [
          {"linear": {"inFeatures": 4, "outFeatures": 4}}, {"relu": {}},
          {"linear": {"inFeatures": 4, "outFeatures": 4}}, {"relu": {}},
          {"linear": {"inFeatures": 4, "outFeatures": 4}}, {"relu": {}},
          {"linear": {"inFeatures": 4, "outFeatures": 4}}, {"relu": {}}]},
      "optimizer": {"sgd": {"lr": 0.1}},
      "batchSize": 32, "microBatches": 8, "steps": 3}})",
                                        &job);
  EXPECT_TRUE(status.ok()) << status;
  job.set_schedule(schedule);
  job.set_num_stages(stages);
  return job;
}

void ExpectInvalid(const v1::JobSpec& job, const std::string& field) {
  const absl::Status status = ValidateJobSpec(job);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(status.message(), HasSubstr(field));
}

TEST(JobSpec, AcceptsEverySchedulesValidJobs) {
  for (v1::ScheduleKindProto s :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_INTERLEAVED,
        v1::SCHEDULE_ZB_H1, v1::SCHEDULE_ASYNC_1F1B, v1::SCHEDULE_2BW}) {
    for (int k : {0, 1, 2, 4}) {
      const absl::Status status = ValidateJobSpec(Job(s, k));
      EXPECT_TRUE(status.ok())
          << v1::ScheduleKindProto_Name(s) << " K=" << k << ": " << status;
    }
  }
  v1::JobSpec job = Job(v1::SCHEDULE_ASYNC_1F1B, 2);
  job.set_vertical_sync(true);
  job.set_wire_dtype(v1::DTYPE_BF16);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
}

TEST(JobSpec, ChecksTheTrainingSpecAndTheStageCount) {
  v1::JobSpec job = Job(v1::SCHEDULE_GPIPE, 2);
  job.clear_training();
  ExpectInvalid(job, "spec.training");
  job = Job(v1::SCHEDULE_GPIPE, 2);
  job.mutable_training()->set_batch_size(0);
  ExpectInvalid(job, "batch_size");
  ExpectInvalid(Job(v1::SCHEDULE_GPIPE, -1), "spec.num_stages");
  ExpectInvalid(Job(v1::SCHEDULE_GPIPE, 9), "spec.num_stages");
  job = Job(v1::SCHEDULE_GPIPE, 2);
  job.set_eval_samples(-1);
  ExpectInvalid(job, "spec.eval_samples");
}

TEST(JobSpec, UnknownScheduleAndDTypeValuesAreErrors) {
  ExpectInvalid(Job(static_cast<v1::ScheduleKindProto>(12), 2),
                "spec.schedule");
  v1::JobSpec job = Job(v1::SCHEDULE_GPIPE, 2);
  job.set_wire_dtype(static_cast<v1::DType>(5));
  ExpectInvalid(job, "spec.wire_dtype");
  // The quantized formats are WireCompression's, not wire dtypes.
  job.set_wire_dtype(v1::DTYPE_INT8);
  ExpectInvalid(job, "spec.wire_dtype");
}

TEST(JobSpec, WireCompressionIsValidated) {
  v1::JobSpec job = Job(v1::SCHEDULE_GPIPE, 2);
  ASSERT_TRUE(ParseJson(R"({"activations": "WIRE_QUANTIZATION_INT8",
                            "gradients": "WIRE_QUANTIZATION_INT4",
                            "rounding": "WIRE_ROUNDING_STOCHASTIC",
                            "groupSize": 64})",
                        job.mutable_wire_compression())
                  .ok());
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  job.mutable_wire_compression()->set_group_size(-4);
  ExpectInvalid(job, "spec.wire_compression.group_size");
  job.mutable_wire_compression()->set_group_size(0);
  job.mutable_wire_compression()->set_gradients(
      static_cast<v1::WireQuantization>(3));
  ExpectInvalid(job, "spec.wire_compression.gradients");
}

TEST(JobSpec, ScheduleOptionsBelongToTheirSchedule) {
  v1::JobSpec job = Job(v1::SCHEDULE_1F1B_FLUSH, 2);
  job.set_vertical_sync(true);
  ExpectInvalid(job, "spec.vertical_sync");
  job = Job(v1::SCHEDULE_1F1B_FLUSH, 2);
  job.set_extra_warmup(1);
  ExpectInvalid(job, "spec.extra_warmup");
  job = Job(v1::SCHEDULE_GPIPE, 2);
  job.set_extra_warmup(-1);  // auto, but GPipe drains every step
  ExpectInvalid(job, "spec.extra_warmup");
  job = Job(v1::SCHEDULE_2BW, 2);
  job.set_extra_warmup(-2);
  ExpectInvalid(job, "spec.extra_warmup");
  job.set_extra_warmup(-1);  // the planner chooses
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  // K = 2, M = 8: stage 0 warms up with 1 + 7 = 8 forwards at most.
  job.set_extra_warmup(7);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  job.set_extra_warmup(8);
  ExpectInvalid(job, "spec.schedule");
  job = Job(v1::SCHEDULE_GPIPE, 2);
  job.set_virtual_stages(2);
  ExpectInvalid(job, "spec.virtual_stages");
  job = Job(v1::SCHEDULE_INTERLEAVED, 2);
  job.set_virtual_stages(1);
  ExpectInvalid(job, "spec.virtual_stages");
  // M = 8 is not divisible by 3 workers; 4 workers x 3 chunks need 12
  // layers.
  ExpectInvalid(Job(v1::SCHEDULE_INTERLEAVED, 3), "spec.num_stages");
  job = Job(v1::SCHEDULE_INTERLEAVED, 4);
  job.set_virtual_stages(3);
  ExpectInvalid(job, "spec.num_stages");
  // 4 x 2e9 chunks overflow an int (found by spec_json_fuzzer): still far
  // more than 8 layers, not a wrapped-around count that passes.
  job.set_virtual_stages(2'000'000'000);
  ExpectInvalid(job, "spec.num_stages");
}

TEST(JobSpec, CrossStepSchedulesRefuseGradientClipping) {
  for (v1::ScheduleKindProto s : {v1::SCHEDULE_ASYNC_1F1B, v1::SCHEDULE_2BW}) {
    v1::JobSpec job = Job(s, 2);
    job.mutable_training()->mutable_optimizer()->set_clip_grad_norm(1.0f);
    ExpectInvalid(job, "clip_grad_norm");
  }
  v1::JobSpec job = Job(v1::SCHEDULE_GPIPE, 2);
  job.mutable_training()->mutable_optimizer()->set_clip_grad_norm(1.0f);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
}

TEST(JobSpec, AFixedStageCountMustSuitTheSchedule) {
  // 2bw needs M >= K - 1: M = 2 on 4 stages cannot keep two versions.
  v1::JobSpec job = Job(v1::SCHEDULE_2BW, 4);
  job.mutable_training()->set_micro_batches(2);
  ExpectInvalid(job, "2bw needs micro_batches");
  job.set_num_stages(3);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
}

TEST(JobSpec, TheoreticalBubbleFollowsTheSchedule) {
  // GPipe and 1F1B-flush: (K - 1) / (M + K - 1) with K = 4, M = 8.
  for (v1::ScheduleKindProto s :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH}) {
    absl::StatusOr<double> b = JobTheoreticalBubble(Job(s, 0), 4);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NEAR(*b, 3.0 / 11.0, 1e-12);
  }
  // Interleaved with the default v = 2: (K - 1) / (v M + K - 1).
  absl::StatusOr<double> interleaved =
      JobTheoreticalBubble(Job(v1::SCHEDULE_INTERLEAVED, 0), 4);
  ASSERT_TRUE(interleaved.ok());
  EXPECT_NEAR(*interleaved, 3.0 / 19.0, 1e-12);
  absl::StatusOr<double> one =
      JobTheoreticalBubble(Job(v1::SCHEDULE_GPIPE, 0), 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 0.0);
  EXPECT_FALSE(
      JobTheoreticalBubble(Job(static_cast<v1::ScheduleKindProto>(12), 0), 4)
          .ok());
  EXPECT_FALSE(JobTheoreticalBubble(Job(v1::SCHEDULE_GPIPE, 0), 0).ok());
}

TEST(JobSpec, ScheduleParamsResolveTheJobsSchedule) {
  v1::JobSpec job = Job(v1::SCHEDULE_INTERLEAVED, 0);
  absl::StatusOr<ScheduleParams> p = JobScheduleParams(job, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, ScheduleKind::kInterleaved);
  EXPECT_EQ(p->num_stages, 4);
  EXPECT_EQ(p->micro_batches, 8);
  EXPECT_EQ(p->virtual_stages, 2);
  job.set_virtual_stages(3);
  EXPECT_EQ(JobScheduleParams(job, 4)->virtual_stages, 3);
  EXPECT_EQ(JobScheduleParams(Job(v1::SCHEDULE_ZB_H1, 0), 2)->virtual_stages,
            1);
}

}  // namespace
}  // namespace pipetrain
