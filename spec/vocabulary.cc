#include "spec/vocabulary.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spec/wire_size.h"

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

namespace pipetrain {
namespace {

constexpr v1::WireQuantization kWireQuantizations[] = {
    v1::WIRE_QUANTIZATION_NONE, v1::WIRE_QUANTIZATION_INT8,
    v1::WIRE_QUANTIZATION_INT4};
constexpr v1::WireRounding kWireRoundings[] = {v1::WIRE_ROUNDING_NEAREST,
                                               v1::WIRE_ROUNDING_STOCHASTIC};

const char* KnownQuantizationName(v1::WireQuantization q) {
  switch (q) {
    case v1::WIRE_QUANTIZATION_NONE:
      return "none";
    case v1::WIRE_QUANTIZATION_INT8:
      return "int8";
    case v1::WIRE_QUANTIZATION_INT4:
      return "int4";
    default:
      return nullptr;
  }
}

const char* KnownRoundingName(v1::WireRounding r) {
  switch (r) {
    case v1::WIRE_ROUNDING_NEAREST:
      return "nearest";
    case v1::WIRE_ROUNDING_STOCHASTIC:
      return "stochastic";
    default:
      return nullptr;
  }
}

template <typename E, size_t N>
std::string ValidNames(const E (&values)[N], const char* (*name)(E)) {
  return absl::StrJoin(values, ", ",
                       [name](std::string* out, E v) { out->append(name(v)); });
}

}  // namespace

std::string WireQuantizationName(v1::WireQuantization quantization) {
  const char* name = KnownQuantizationName(quantization);
  return name != nullptr
             ? name
             : absl::StrCat("unknown(", static_cast<int>(quantization), ")");
}

absl::StatusOr<v1::WireQuantization> ParseWireQuantization(
    absl::string_view name) {
  for (v1::WireQuantization q : kWireQuantizations) {
    if (name == KnownQuantizationName(q)) return q;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown wire quantization \"", name,
      "\"; valid: ", ValidNames(kWireQuantizations, &KnownQuantizationName)));
}

std::string WireRoundingName(v1::WireRounding rounding) {
  const char* name = KnownRoundingName(rounding);
  return name != nullptr
             ? name
             : absl::StrCat("unknown(", static_cast<int>(rounding), ")");
}

absl::StatusOr<v1::WireRounding> ParseWireRounding(absl::string_view name) {
  for (v1::WireRounding r : kWireRoundings) {
    if (name == KnownRoundingName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown wire rounding \"", name,
      "\"; valid: ", ValidNames(kWireRoundings, &KnownRoundingName)));
}

absl::Status ValidateWireCompression(const v1::WireCompression& compression,
                                     absl::string_view prefix) {
  const auto quantization = [&](const char* field,
                                v1::WireQuantization q) -> absl::Status {
    if (KnownQuantizationName(q) != nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".", field, ": unknown value ", static_cast<int>(q),
        " (valid: ", ValidNames(kWireQuantizations, &KnownQuantizationName),
        ")"));
  };
  if (absl::Status s = quantization("activations", compression.activations());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = quantization("gradients", compression.gradients());
      !s.ok()) {
    return s;
  }
  if (KnownRoundingName(compression.rounding()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".rounding: unknown value ",
        static_cast<int>(compression.rounding()),
        " (valid: ", ValidNames(kWireRoundings, &KnownRoundingName), ")"));
  }
  if (compression.group_size() < 0 ||
      compression.group_size() > kMaxWireGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".group_size: ", compression.group_size(), " must be in [0, ",
        kMaxWireGroupSize, "] (0: the default, ", kDefaultWireGroupSize, ")"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
