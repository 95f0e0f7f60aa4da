// The one conversion table per word: every value the protos declare has a
// C++ enum value and a name, every enum value round-trips, and anything
// else is an error in every direction.
#include "spec/vocabulary.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

TEST(Vocabulary, EveryScheduleTheProtoDeclaresConvertsBothWays) {
  const google::protobuf::EnumDescriptor* d =
      v1::ScheduleKindProto_descriptor();
  ASSERT_EQ(d->value_count(), 6);
  for (int i = 0; i < d->value_count(); ++i) {
    const auto proto =
        static_cast<v1::ScheduleKindProto>(d->value(i)->number());
    absl::StatusOr<ScheduleKind> kind = ScheduleKindFromProto(proto);
    ASSERT_TRUE(kind.ok()) << d->value(i)->name() << ": " << kind.status();
    EXPECT_EQ(ScheduleKindToProto(*kind), proto);
    absl::StatusOr<ScheduleKind> parsed =
        ParseScheduleKind(ScheduleKindName(*kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, *kind);
  }
}

TEST(Vocabulary, ScheduleNamesAreTheDocumentedOnes) {
  EXPECT_EQ(*ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*ParseScheduleKind("1f1b-flush"), ScheduleKind::kOneFOneBFlush);
  EXPECT_EQ(*ParseScheduleKind("interleaved"), ScheduleKind::kInterleaved);
  EXPECT_EQ(*ParseScheduleKind("zb-h1"), ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(*ParseScheduleKind("1f1b-async"), ScheduleKind::kOneFOneBAsync);
  EXPECT_EQ(*ParseScheduleKind("2bw"), ScheduleKind::kTwoBW);
  EXPECT_EQ(ScheduleKindToProto(ScheduleKind::kOneFOneBAsync),
            v1::SCHEDULE_ASYNC_1F1B);
}

TEST(Vocabulary, UnknownSchedulesAreErrors) {
  absl::StatusOr<ScheduleKind> bad = ParseScheduleKind("pipedream");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("gpipe, 1f1b-flush, interleaved, zb-h1"));
  EXPECT_EQ(ParseScheduleKind("GPipe").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ScheduleKind> wire =
      ScheduleKindFromProto(static_cast<v1::ScheduleKindProto>(17));
  EXPECT_EQ(wire.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wire.status().message(), HasSubstr("17"));
  // A value from outside the enum never becomes a valid schedule.
  const v1::ScheduleKindProto out =
      ScheduleKindToProto(static_cast<ScheduleKind>(42));
  EXPECT_FALSE(ScheduleKindFromProto(out).ok());
  EXPECT_STREQ(ScheduleKindName(static_cast<ScheduleKind>(42)), "unknown");
}

TEST(Vocabulary, EveryDTypeTheProtoDeclaresConvertsBothWays) {
  const google::protobuf::EnumDescriptor* d = v1::DType_descriptor();
  ASSERT_EQ(d->value_count(), 3);
  for (int i = 0; i < d->value_count(); ++i) {
    const auto proto = static_cast<v1::DType>(d->value(i)->number());
    absl::StatusOr<DType> dtype = DTypeFromProto(proto);
    ASSERT_TRUE(dtype.ok()) << d->value(i)->name() << ": " << dtype.status();
    EXPECT_EQ(DTypeToProto(*dtype), proto);
    absl::StatusOr<DType> parsed = ParseDTypeName(DTypeName(*dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, *dtype);
  }
  EXPECT_EQ(*ParseDTypeName("bf16"), DType::kBF16);
  EXPECT_EQ(DTypeToProto(DType::kF16), v1::DTYPE_F16);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
}

TEST(Vocabulary, UnknownDTypesAreErrorsNotFloat32) {
  absl::StatusOr<DType> wire = DTypeFromProto(static_cast<v1::DType>(9));
  EXPECT_EQ(wire.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wire.status().message(), HasSubstr("f32, bf16, f16"));
  EXPECT_EQ(ParseDTypeName("fp8").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DTypeFromProto(DTypeToProto(static_cast<DType>(7))).ok());
}

}  // namespace
}  // namespace pipetrain
