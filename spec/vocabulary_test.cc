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

// The quantized wire formats (DTYPE_INT8, DTYPE_INT4) are not tensor
// dtypes: a tensor is never stored in them, and DTypeFromProto refuses
// them (the wire codec reads them with the job's WireCompression).
bool IsQuantizedWireFormat(v1::DType dtype) {
  return dtype == v1::DTYPE_INT8 || dtype == v1::DTYPE_INT4;
}

TEST(Vocabulary, EveryDTypeTheProtoDeclaresConvertsBothWays) {
  const google::protobuf::EnumDescriptor* d = v1::DType_descriptor();
  ASSERT_EQ(d->value_count(), 5);
  for (int i = 0; i < d->value_count(); ++i) {
    const auto proto = static_cast<v1::DType>(d->value(i)->number());
    if (IsQuantizedWireFormat(proto)) {
      EXPECT_FALSE(DTypeFromProto(proto).ok()) << d->value(i)->name();
      continue;
    }
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

TEST(Vocabulary, WireCompressionNamesConvertBothWays) {
  const google::protobuf::EnumDescriptor* q = v1::WireQuantization_descriptor();
  for (int i = 0; i < q->value_count(); ++i) {
    const auto value = static_cast<v1::WireQuantization>(q->value(i)->number());
    absl::StatusOr<v1::WireQuantization> parsed =
        ParseWireQuantization(WireQuantizationName(value));
    ASSERT_TRUE(parsed.ok()) << q->value(i)->name() << ": " << parsed.status();
    EXPECT_EQ(*parsed, value);
  }
  const google::protobuf::EnumDescriptor* r = v1::WireRounding_descriptor();
  for (int i = 0; i < r->value_count(); ++i) {
    const auto value = static_cast<v1::WireRounding>(r->value(i)->number());
    absl::StatusOr<v1::WireRounding> parsed =
        ParseWireRounding(WireRoundingName(value));
    ASSERT_TRUE(parsed.ok()) << r->value(i)->name() << ": " << parsed.status();
    EXPECT_EQ(*parsed, value);
  }
  EXPECT_EQ(WireQuantizationName(v1::WIRE_QUANTIZATION_INT4), "int4");
  EXPECT_EQ(WireRoundingName(v1::WIRE_ROUNDING_STOCHASTIC), "stochastic");
  EXPECT_EQ(WireQuantizationName(static_cast<v1::WireQuantization>(9)),
            "unknown(9)");
  EXPECT_THAT(ParseWireQuantization("fp8").status().message(),
              HasSubstr("valid: none, int8, int4"));
  EXPECT_THAT(ParseWireRounding("up").status().message(),
              HasSubstr("valid: nearest, stochastic"));
}

TEST(Vocabulary, WireCompressionIsValidatedFieldByField) {
  v1::WireCompression c;
  EXPECT_TRUE(ValidateWireCompression(c, "spec.wire_compression").ok());
  c.set_activations(v1::WIRE_QUANTIZATION_INT4);
  c.set_gradients(v1::WIRE_QUANTIZATION_INT8);
  c.set_rounding(v1::WIRE_ROUNDING_STOCHASTIC);
  c.set_group_size(kMaxWireGroupSize);
  EXPECT_TRUE(ValidateWireCompression(c, "spec.wire_compression").ok());
  struct Case {
    v1::WireCompression c;
    const char* message;
  };
  std::vector<Case> cases(4, Case{c, ""});
  cases[0].c.set_activations(static_cast<v1::WireQuantization>(7));
  cases[0].message = "spec.wire_compression.activations: unknown value 7";
  cases[1].c.set_gradients(static_cast<v1::WireQuantization>(-1));
  cases[1].message = "spec.wire_compression.gradients: unknown value -1";
  cases[2].c.set_rounding(static_cast<v1::WireRounding>(3));
  cases[2].message = "spec.wire_compression.rounding: unknown value 3";
  cases[3].c.set_group_size(-1);
  cases[3].message = "spec.wire_compression.group_size: -1 must be in [0, ";
  for (const Case& bad : cases) {
    const absl::Status s =
        ValidateWireCompression(bad.c, "spec.wire_compression");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(bad.message));
  }
  c.set_group_size(kMaxWireGroupSize + 1);
  EXPECT_FALSE(ValidateWireCompression(c, "x").ok());
}

}  // namespace
}  // namespace pipetrain
