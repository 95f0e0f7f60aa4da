#include "services/ctl/job_input.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace ctl {
namespace {

using ::testing::HasSubstr;

TEST(ParseJobInput, ReadsAWholeJobSpec) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobInput(R"({
    "training": {"name": "mlp", "batchSize": 64},
    "schedule": "SCHEDULE_1F1B_FLUSH",
    "numStages": 3,
    "wireDtype": "DTYPE_BF16"
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training().name(), "mlp");
  EXPECT_EQ(spec->training().batch_size(), 64);
  EXPECT_EQ(spec->schedule(), v1::SCHEDULE_1F1B_FLUSH);
  EXPECT_EQ(spec->num_stages(), 3);
  EXPECT_EQ(spec->wire_dtype(), v1::DTYPE_BF16);
}

TEST(ParseJobInput, WrapsABareTrainingSpec) {
  // What pipetrain-train takes, in either JSON field spelling.
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobInput(R"({"name": "mlp", "batch_size": 64, "microBatches": 4})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training().name(), "mlp");
  EXPECT_EQ(spec->training().batch_size(), 64);
  EXPECT_EQ(spec->training().micro_batches(), 4);
  EXPECT_EQ(spec->num_stages(), 0);
}

TEST(ParseJobInput, JobSpecWithoutTrainingIsAnError) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobInput(R"({"numStages": 2})");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("no `training`"));
}

TEST(ParseJobInput, NeitherSpecReportsBothParsers) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobInput(R"({"name": "mlp", "numStages": 2})");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("invalid JobSpec JSON"));
  EXPECT_THAT(spec.status().message(), HasSubstr("invalid TrainingSpec JSON"));
  EXPECT_FALSE(ParseJobInput("{not json").ok());
}

TEST(ReadJobInput, MissingFileIsNotFoundAndNamed) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobInput("/nonexistent/job.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("/nonexistent/job.json"));
}

TEST(ScheduleAndWireNames, NameKnownValuesAndShowUnknownOnes) {
  EXPECT_EQ(ScheduleName(v1::SCHEDULE_1F1B_FLUSH), "1f1b-flush");
  EXPECT_EQ(ScheduleName(v1::SCHEDULE_ASYNC_1F1B), "1f1b-async");
  EXPECT_EQ(WireName(v1::DTYPE_BF16), "bf16");
  EXPECT_EQ(ScheduleName(static_cast<v1::ScheduleKindProto>(42)),
            "unknown(42)");
  EXPECT_EQ(WireName(static_cast<v1::DType>(7)), "unknown(7)");
}

TEST(ApplyJobOverrides, FlagsReplaceTheSpecsValues) {
  v1::JobSpec spec;
  spec.set_num_stages(4);
  spec.set_schedule(v1::SCHEDULE_1F1B_FLUSH);
  JobOverrides overrides;
  overrides.num_stages = 2;
  overrides.schedule = "gpipe";
  overrides.wire = "bf16";
  overrides.wire_compression = "int4";
  spec.mutable_wire_compression()->set_group_size(64);
  ASSERT_TRUE(ApplyJobOverrides(overrides, &spec).ok());
  EXPECT_EQ(spec.num_stages(), 2);
  EXPECT_EQ(spec.schedule(), v1::SCHEDULE_GPIPE);
  EXPECT_EQ(spec.wire_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(spec.wire_compression().activations(), v1::WIRE_QUANTIZATION_INT4);
  EXPECT_EQ(spec.wire_compression().gradients(), v1::WIRE_QUANTIZATION_INT4);
  EXPECT_EQ(spec.wire_compression().group_size(), 64);
}

TEST(ApplyJobOverrides, UnsetFlagsLeaveTheSpecAlone) {
  v1::JobSpec spec;
  spec.set_num_stages(4);
  spec.set_wire_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(ApplyJobOverrides(JobOverrides(), &spec).ok());
  EXPECT_EQ(spec.num_stages(), 4);
  EXPECT_EQ(spec.wire_dtype(), v1::DTYPE_BF16);
}

TEST(ApplyJobOverrides, RejectsUnknownNames) {
  v1::JobSpec spec;
  JobOverrides wire;
  wire.wire = "fp8";
  EXPECT_EQ(ApplyJobOverrides(wire, &spec).code(),
            absl::StatusCode::kInvalidArgument);
  JobOverrides compression;
  compression.wire_compression = "int2";
  const absl::Status bad_compression = ApplyJobOverrides(compression, &spec);
  EXPECT_EQ(bad_compression.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_compression.message(),
              HasSubstr("unknown wire quantization \"int2\"; valid: none, "
                        "int8, int4"));
  JobOverrides schedule;
  schedule.schedule = "1f1b";
  const absl::Status status = ApplyJobOverrides(schedule, &spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("unknown schedule kind \"1f1b\"; valid: gpipe"));
}

// LoadJob checks what submit would send with the scheduler's own rules.
TEST(LoadJob, ValidatesTheJobWithItsOverrides) {
  const char* root = std::getenv("PIPETRAIN_SOURCE_DIR");
  const std::string path = std::string(root != nullptr ? root : ".") +
                           "/examples/fashion_mnist_mlp.job.json";
  JobOverrides overrides;
  overrides.schedule = "1f1b-flush";
  absl::StatusOr<v1::JobSpec> spec = LoadJob(path, overrides);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule(), v1::SCHEDULE_1F1B_FLUSH);

  overrides.num_stages = -2;
  EXPECT_THAT(LoadJob(path, overrides).status().message(),
              HasSubstr("spec.num_stages"));
  // Interleaving 3 workers needs micro-batches (4 here) divisible by 3.
  overrides.num_stages = 3;
  overrides.schedule = "interleaved";
  EXPECT_THAT(LoadJob(path, overrides).status().message(),
              HasSubstr("divisible by 3"));
}

}  // namespace
}  // namespace ctl
}  // namespace pipetrain
