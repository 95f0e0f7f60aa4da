// The words the whole system shares, and their one conversion table each:
// schedule kinds and tensor dtypes as C++ enums, as proto (wire) values and
// as user-facing names ("1f1b-flush", "bf16"). Every layer converts here
// and nowhere else, and an unknown value is an error in every direction,
// never a silent default.
#ifndef PIPETRAIN_SPEC_VOCABULARY_H_
#define PIPETRAIN_SPEC_VOCABULARY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "pipetrain/v1/tensor.pb.h"

namespace pipetrain {

enum class ScheduleKind {
  kGPipe = 0,      // all forwards, then all backwards, one update (flush)
  kOneFOneBFlush,  // PipeDream-Flush: 1F1B steady state, one update (flush)
  kInterleaved,    // interleaved 1F1B, v virtual stages (chunks) per stage
  kZeroBubbleH1,   // ZB-H1: backward split into B (input) and W (weight)
  // PipeDream's asynchronous 1F1B: 1F1B's order, and an optimizer step after
  // every micro-batch's backward (no gradient accumulation). Backward uses
  // the weights its forward used (weight stashing). Cross-step: no flush
  // between steps.
  kOneFOneBAsync,
  // PipeDream-2BW: 1F1B's order across steps (no flush); a step's M
  // gradients accumulate and are applied once, right after its last
  // backward. Double-buffered weights: every micro-batch of step t uses
  // the version after step t - 2's update (W(t+1) = W(t) - lr grad(W(t-1))),
  // so a stage keeps at most 2 versions. Needs M >= K - 1.
  kTwoBW,
};

// "gpipe", "1f1b-flush", "interleaved", "zb-h1", "1f1b-async", "2bw";
// "unknown" for a value outside the enum.
const char* ScheduleKindName(ScheduleKind kind);
// InvalidArgument listing the valid names for anything else.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
// InvalidArgument for a proto value this build does not know.
absl::StatusOr<ScheduleKind> ScheduleKindFromProto(v1::ScheduleKindProto kind);
// A value cast from outside the enum maps to -1, which FromProto rejects.
v1::ScheduleKindProto ScheduleKindToProto(ScheduleKind kind);

// "f32", "bf16", "f16"; "unknown" for a value outside the enum.
const char* DTypeName(DType dtype);
// InvalidArgument listing the valid names for anything else.
absl::StatusOr<DType> ParseDTypeName(absl::string_view name);
// InvalidArgument for a proto value this build does not know (a newer
// peer's dtype, or garbage from the wire).
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);
// A value cast from outside the enum maps to -1, which FromProto rejects.
v1::DType DTypeToProto(DType dtype);

// Wire compression (WireCompression in job.proto): "none", "int8",
// "int4" and "nearest", "stochastic"; "unknown(N)" for a value outside the
// enum. The parsers answer InvalidArgument listing the valid names.
std::string WireQuantizationName(v1::WireQuantization quantization);
absl::StatusOr<v1::WireQuantization> ParseWireQuantization(
    absl::string_view name);
std::string WireRoundingName(v1::WireRounding rounding);
absl::StatusOr<v1::WireRounding> ParseWireRounding(absl::string_view name);

// The largest WireCompression.group_size accepted (a group this long is
// a whole row of any activation in practice).
inline constexpr int32_t kMaxWireGroupSize = 1 << 20;

// A WireCompression this build can apply: known quantizations and
// rounding, 0 <= group_size <= kMaxWireGroupSize. InvalidArgument naming
// the field as `prefix`.<field> (e.g. "spec.wire_compression.group_size").
absl::Status ValidateWireCompression(const v1::WireCompression& compression,
                                     absl::string_view prefix);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_VOCABULARY_H_
