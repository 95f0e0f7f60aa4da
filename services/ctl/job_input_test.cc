#include "services/ctl/job_input.h"

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

TEST(ScheduleAndWireNames, RoundTrip) {
  for (const char* name : {"gpipe", "1f1b-flush", "interleaved", "zb-h1"}) {
    absl::StatusOr<v1::ScheduleKindProto> kind = ParseScheduleName(name);
    ASSERT_TRUE(kind.ok()) << name;
    EXPECT_EQ(ScheduleName(*kind), name);
  }
  for (const char* name : {"f32", "bf16", "f16"}) {
    absl::StatusOr<v1::DType> dtype = ParseWireName(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(WireName(*dtype), name);
  }
  EXPECT_THAT(ParseScheduleName("1f1b").status().message(),
              HasSubstr("unknown schedule '1f1b' (one of gpipe, 1f1b-flush"));
}

TEST(ApplyJobOverrides, FlagsReplaceTheSpecsValues) {
  v1::JobSpec spec;
  spec.set_num_stages(4);
  spec.set_schedule(v1::SCHEDULE_1F1B_FLUSH);
  JobOverrides overrides;
  overrides.num_stages = 2;
  overrides.schedule = "gpipe";
  overrides.wire = "bf16";
  ASSERT_TRUE(ApplyJobOverrides(overrides, &spec).ok());
  EXPECT_EQ(spec.num_stages(), 2);
  EXPECT_EQ(spec.schedule(), v1::SCHEDULE_GPIPE);
  EXPECT_EQ(spec.wire_dtype(), v1::DTYPE_BF16);
}

TEST(ApplyJobOverrides, UnsetFlagsLeaveTheSpecAlone) {
  v1::JobSpec spec;
  spec.set_num_stages(4);
  spec.set_wire_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(ApplyJobOverrides(JobOverrides(), &spec).ok());
  EXPECT_EQ(spec.num_stages(), 4);
  EXPECT_EQ(spec.wire_dtype(), v1::DTYPE_BF16);
}

TEST(ApplyJobOverrides, RejectsBadValues) {
  v1::JobSpec spec;
  JobOverrides negative;
  negative.num_stages = -2;
  EXPECT_EQ(ApplyJobOverrides(negative, &spec).code(),
            absl::StatusCode::kInvalidArgument);
  JobOverrides wire;
  wire.wire = "fp8";
  EXPECT_EQ(ApplyJobOverrides(wire, &spec).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ctl
}  // namespace pipetrain
