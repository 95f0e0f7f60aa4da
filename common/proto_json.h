// Protobuf messages as JSON, the one place that configures protobuf's JSON
// mapping: specs users write (job files, REST bodies) are parsed strictly,
// so a misspelt field is an error instead of a silently ignored setting.
#ifndef PIPETRAIN_COMMON_PROTO_JSON_H_
#define PIPETRAIN_COMMON_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace pipetrain {

// Objects and arrays nested deeper than this are refused before parsing:
// no spec needs more than a handful of levels, and a parser walking a
// megabyte of '[' would recurse that deep.
inline constexpr int kMaxJsonDepth = 32;

// Parses `json` into `msg` (proto field names or their lowerCamelCase JSON
// names both work). InvalidArgument naming the message type and what is
// wrong: malformed JSON, nesting deeper than kMaxJsonDepth, an unknown
// field, a value of the wrong type.
absl::Status ParseJson(absl::string_view json, google::protobuf::Message* msg);

// Reads a file and parses it: NotFound naming the file when it cannot be
// opened, InvalidArgument prefixed with the path when it does not parse.
absl::Status ReadJsonFile(const std::string& path,
                          google::protobuf::Message* msg);

// Indented JSON with the .proto field names, for people and files.
std::string ToJson(const google::protobuf::Message& msg);

// One line in the proto3 JSON mapping (lowerCamelCase names) with every
// field printed, defaults included, so API clients see the whole message.
std::string ToApiJson(const google::protobuf::Message& msg);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PROTO_JSON_H_
