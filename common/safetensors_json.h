// The JSON half of the safetensors reader (internal to common/): parses a
// header into a nlohmann::json value with the limits the format needs and
// the library does not enforce by itself.
#ifndef PIPETRAIN_COMMON_SAFETENSORS_JSON_H_
#define PIPETRAIN_COMMON_SAFETENSORS_JSON_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace safetensors_internal {

// Parses `text` as one JSON value. InvalidArgument with nlohmann's message
// (which gives the byte position) for malformed JSON, and for what the
// library would accept but a header must not have: a key repeated within
// one object (the library keeps the last silently, which would let a file
// say two things about one tensor) or nesting deeper than `max_depth`
// containers (a header needs 3; the limit also bounds memory).
absl::StatusOr<nlohmann::json> ParseJsonStrict(absl::string_view text,
                                               int max_depth);

}  // namespace safetensors_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SAFETENSORS_JSON_H_
