#include "common/proto_json.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace pipetrain {

absl::Status ParseJson(absl::string_view json, google::protobuf::Message* msg) {
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
