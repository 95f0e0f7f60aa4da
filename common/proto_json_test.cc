// JSON of protobuf messages, on a well-known proto3 type (google.protobuf
// Method) so the test needs none of the project's protos.
#include "common/proto_json.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/api.pb.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

TEST(ProtoJson, ParsesJsonAndProtoFieldNames) {
  google::protobuf::Method m;
  ASSERT_TRUE(ParseJson(R"({"name": "Train", "requestTypeUrl": "a",
                    "response_type_url": "b", "requestStreaming": true})",
                        &m)
                  .ok());
  EXPECT_EQ(m.name(), "Train");
  EXPECT_EQ(m.request_type_url(), "a");
  EXPECT_EQ(m.response_type_url(), "b");
  EXPECT_TRUE(m.request_streaming());
}

TEST(ProtoJson, RejectsUnknownFieldsWrongTypesAndBrokenJson) {
  google::protobuf::Method m;
  const absl::Status unknown = ParseJson(R"({"nmae": "Train"})", &m);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("invalid Method JSON"));
  EXPECT_THAT(unknown.message(), HasSubstr("nmae"));
  EXPECT_EQ(ParseJson(R"({"requestStreaming": "yes please"})", &m).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJson(R"({"name": )", &m).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProtoJson, RefusesDeepNestingBeforeParsing) {
  google::protobuf::Method m;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const absl::Status status = ParseJson(deep, &m);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("nested deeper than 32 levels"));
  // Brackets inside strings (escaped quotes too) do not count, and a
  // spec's few levels pass.
  const std::string name = std::string(40, '[') + "\\\"";
  const absl::Status ok =
      ParseJson(absl::StrCat(R"({"name": ")", name, R"("})"), &m);
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(m.name(), std::string(40, '[') + "\"");
  EXPECT_TRUE(ParseJson(R"({"options": [{"name": "a"}]})", &m).ok());
}

TEST(ProtoJson, PrintsForPeopleAndForApis) {
  google::protobuf::Method m;
  m.set_name("Train");
  m.set_request_type_url("a");
  const std::string people = ToJson(m);
  EXPECT_THAT(people, HasSubstr("\"request_type_url\": \"a\""));
  EXPECT_THAT(people, HasSubstr("\n"));
  EXPECT_THAT(people, ::testing::Not(HasSubstr("response_streaming")));

  const std::string api = ToApiJson(m);
  EXPECT_THAT(api, HasSubstr("\"requestTypeUrl\":\"a\""));
  EXPECT_THAT(api, HasSubstr("\"responseStreaming\":false"));
  EXPECT_THAT(api, ::testing::Not(HasSubstr("\n")));

  google::protobuf::Method again;
  ASSERT_TRUE(ParseJson(people, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), m.SerializeAsString());
  ASSERT_TRUE(ParseJson(api, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), m.SerializeAsString());
}

TEST(ProtoJson, ReadsFilesAndNamesTheFileInErrors) {
  google::protobuf::Method m;
  EXPECT_EQ(ReadJsonFile("/nonexistent/method.json", &m).code(),
            absl::StatusCode::kNotFound);
  const std::string path =
      ::testing::TempDir() + "/proto_json_test_method.json";
  {
    std::ofstream out(path);
    out << R"({"name": "Train", "bogus": 1})";
  }
  const absl::Status bad = ReadJsonFile(path, &m);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr(path));
  {
    std::ofstream out(path);
    out << R"({"name": "Train"})";
  }
  ASSERT_TRUE(ReadJsonFile(path, &m).ok());
  EXPECT_EQ(m.name(), "Train");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pipetrain
