#include "common/proto_json.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace pipetrain {

namespace {

// The deepest nesting of objects and arrays in `json`, counting brackets
// outside strings; stops counting once past `limit`.
int NestingDepth(absl::string_view json, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size() && deepest <= limit; ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

absl::Status ParseJson(absl::string_view json, google::protobuf::Message* msg) {
  if (NestingDepth(json, kMaxJsonDepth) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", msg->GetDescriptor()->name(),
                     " JSON: nested deeper than ", kMaxJsonDepth, " levels"));
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), msg, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", msg->GetDescriptor()->name(),
                     " JSON: ", std::string(status.message())));
  }
  return absl::OkStatus();
}

absl::Status ReadJsonFile(const std::string& path,
                          google::protobuf::Message* msg) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const absl::Status status = ParseJson(buffer.str(), msg);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", status.message()));
  }
  return absl::OkStatus();
}

std::string ToJson(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing fails only for an Any whose type is unknown; none is used.
  (void)google::protobuf::util::MessageToJsonString(msg, &out, options);
  return out;
}

std::string ToApiJson(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(msg, &out, options);
  return out;
}

}  // namespace pipetrain
