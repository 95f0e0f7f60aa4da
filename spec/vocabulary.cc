#include "spec/vocabulary.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain {
namespace {

// The forward conversions below are switches without a default, so the
// compiler (-Wswitch, an error here) names any enumerator left out; the
// reverse conversions search these lists, which vocabulary_test checks
// against every value the protos declare.
constexpr ScheduleKind kScheduleKinds[] = {
    ScheduleKind::kGPipe,         ScheduleKind::kOneFOneBFlush,
    ScheduleKind::kInterleaved,   ScheduleKind::kZeroBubbleH1,
    ScheduleKind::kOneFOneBAsync, ScheduleKind::kTwoBW};
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

std::string ValidScheduleNames() {
  return absl::StrJoin(kScheduleKinds, ", ",
                       [](std::string* out, ScheduleKind k) {
                         out->append(ScheduleKindName(k));
                       });
}

std::string ValidDTypeNames() {
  return absl::StrJoin(kDTypes, ", ", [](std::string* out, DType d) {
    out->append(DTypeName(d));
  });
}

}  // namespace

const char* ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneBFlush:
      return "1f1b-flush";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kOneFOneBAsync:
      return "1f1b-async";
    case ScheduleKind::kTwoBW:
      return "2bw";
  }
  return "unknown";
}

v1::ScheduleKindProto ScheduleKindToProto(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return v1::SCHEDULE_GPIPE;
    case ScheduleKind::kOneFOneBFlush:
      return v1::SCHEDULE_1F1B_FLUSH;
    case ScheduleKind::kInterleaved:
      return v1::SCHEDULE_INTERLEAVED;
    case ScheduleKind::kZeroBubbleH1:
      return v1::SCHEDULE_ZB_H1;
    case ScheduleKind::kOneFOneBAsync:
      return v1::SCHEDULE_ASYNC_1F1B;
    case ScheduleKind::kTwoBW:
      return v1::SCHEDULE_2BW;
  }
  // Only a value cast from outside the enum gets here; make it one no
  // reader accepts rather than a valid schedule.
  return static_cast<v1::ScheduleKindProto>(-1);
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  for (ScheduleKind kind : kScheduleKinds) {
    if (name == ScheduleKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown schedule kind \"", name, "\"; valid: ", ValidScheduleNames()));
}

absl::StatusOr<ScheduleKind> ScheduleKindFromProto(v1::ScheduleKindProto kind) {
  for (ScheduleKind k : kScheduleKinds) {
    if (ScheduleKindToProto(k) == kind) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("schedule: unknown value ", static_cast<int>(kind),
                   " (valid: ", ValidScheduleNames(), ")"));
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "unknown";
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF16:
      return v1::DTYPE_F16;
  }
  // As for schedules: unreadable rather than silently float32.
  return static_cast<v1::DType>(-1);
}

absl::StatusOr<DType> ParseDTypeName(absl::string_view name) {
  for (DType dtype : kDTypes) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\"; valid: ", ValidDTypeNames()));
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  for (DType d : kDTypes) {
    if (DTypeToProto(d) == dtype) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: unknown value ", static_cast<int>(dtype),
                   " (valid: ", ValidDTypeNames(), ")"));
}

}  // namespace pipetrain
