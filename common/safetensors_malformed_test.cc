// The reader against malformed input: each case must be InvalidArgument
// with a message saying what is wrong, and nothing may crash.
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/durable_file.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

std::string Length(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file with this header text and `data_bytes` bytes of data.
std::string File(const std::string& header, size_t data_bytes) {
  return Length(header.size()) + header + std::string(data_bytes, '\0');
}

std::string Tensor(const std::string& name, const std::string& fields) {
  return "\"" + name + "\":{" + fields + "}";
}

struct Case {
  const char* what;
  std::string bytes;
  const char* message;
};

std::vector<Case> Cases() {
  const std::string ok_a =
      Tensor("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])");
  return {
      {"empty", "", "truncated: 0 bytes"},
      {"short length", std::string(5, '\0'), "truncated: 5 bytes"},
      {"header past end", Length(100) + "{}", "runs past the end"},
      {"huge header length", Length(1ULL << 63) + "{}", "over the limit"},
      {"header not an object", File("[1,2]   ", 0), "does not start with '{'"},
      {"zero-length header", Length(0), "does not start with '{'"},
      {"unterminated JSON", File(R"({"a":)", 0), "not valid JSON"},
      {"trailing garbage", File("{} x", 0), "not valid JSON"},
      {"not UTF-8", File("{\"\xff\":1}", 0), "not valid JSON"},
      {"duplicate tensor", File("{" + ok_a + "," + ok_a + "}", 8),
       "appears twice"},
      {"deep nesting", File(R"({"a":{"b":{"c":{"d":1}}}})", 0),
       "nested deeper"},
      {"metadata value not a string", File(R"({"__metadata__":{"step":7}})", 0),
       "not a string"},
      {"metadata not an object", File(R"({"__metadata__":"x"})", 0),
       "not an object of strings"},
      {"unknown dtype",
       File("{" +
                Tensor("a",
                       R"("dtype":"F33","shape":[2],"data_offsets":[0,8])") +
                "}",
            8),
       "unknown dtype \"F33\""},
      {"dtype not a string",
       File("{" + Tensor("a", R"("dtype":4,"shape":[2],"data_offsets":[0,8])") +
                "}",
            8),
       "dtype is not a string"},
      {"missing shape",
       File("{" + Tensor("a", R"("dtype":"F32","data_offsets":[0,8])") + "}",
            8),
       "has no \"shape\""},
      {"unknown field",
       File("{" +
                Tensor(
                    "a",
                    R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1)") +
                "}",
            8),
       "unknown field \"x\""},
      {"tensor not an object", File(R"({"a":[1]})", 0), "not an object"},
      {"negative dimension",
       File("{" +
                Tensor("a",
                       R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])") +
                "}",
            8),
       "negative"},
      {"fractional dimension",
       File("{" +
                Tensor("a",
                       R"("dtype":"F32","shape":[2.5],"data_offsets":[0,8])") +
                "}",
            8),
       "not an integer"},
      {"three offsets",
       File("{" +
                Tensor("a",
                       R"("dtype":"F32","shape":[2],"data_offsets":[0,4,8])") +
                "}",
            8),
       "not [begin, end]"},
      {"end before begin",
       File("{" +
                Tensor("a",
                       R"("dtype":"F32","shape":[0],"data_offsets":[8,0])") +
                "}",
            8),
       "before begin"},
      {"shape and size disagree",
       File("{" +
                Tensor("a",
                       R"("dtype":"F32","shape":[3],"data_offsets":[0,8])") +
                "}",
            8),
       "need 12"},
      {"element count overflow",
       File(
           "{" +
               Tensor(
                   "a",
                   R"("dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8])") +
               "}",
           8),
       "overflows"},
      {"byte size overflow",
       File(
           "{" +
               Tensor(
                   "a",
                   R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8])") +
               "}",
           8),
       "overflows"},
      {"offset beyond 63 bits",
       File(
           "{" +
               Tensor(
                   "a",
                   R"("dtype":"F32","shape":[2],"data_offsets":[18446744073709551615,8])") +
               "}",
           8),
       "does not fit in 63 bits"},
      {"data past the end", File("{" + ok_a + "}", 4),
       "past the end of the data"},
      {"overlapping tensors",
       File("{" + ok_a + "," +
                Tensor("b",
                       R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") +
                "}",
            12),
       "(overlap)"},
      {"gap between tensors",
       File("{" + ok_a + "," +
                Tensor("b",
                       R"("dtype":"F32","shape":[1],"data_offsets":[12,16])") +
                "}",
            16),
       "there is a gap"},
      {"data not starting at 0",
       File("{" +
                Tensor("a",
                       R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") +
                "}",
            8),
       "there is a gap"},
      {"bytes after the last tensor", File("{" + ok_a + "}", 12),
       "has 12 bytes but the tensors cover 8"},
      {"empty name",
       File(
           "{" +
               Tensor("", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") +
               "}",
           8),
       "empty name"},
  };
}

TEST(SafetensorsMalformedTest, EachCaseIsAClearInvalidArgument) {
  for (const Case& c : Cases()) {
    absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(c.bytes);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
    EXPECT_THAT(index.status().message(), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(index.status().message(), HasSubstr("safetensors: ")) << c.what;
  }
}

std::string ValidFile() {
  const std::string a(24, '\x11'), b(8, '\x22');
  return *SerializeSafetensors(
      {{"layers.0.weight", SafetensorsDtype::kF32, {2, 3}, a},
       {"layers.0.bias", SafetensorsDtype::kI64, {1}, b}},
      {{"step", "3"}});
}

TEST(SafetensorsMalformedTest, EveryTruncationIsRejected) {
  const std::string full = ValidFile();
  ASSERT_TRUE(ParseSafetensors(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    absl::StatusOr<SafetensorsIndex> index =
        ParseSafetensors(absl::string_view(full).substr(0, n));
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument)
        << "truncated to " << n << " bytes";
  }
}

// Random byte flips anywhere: either still a valid file (a flip inside
// tensor data or header padding) or InvalidArgument, never anything else.
TEST(SafetensorsMalformedTest, RandomCorruptionNeverCrashes) {
  const std::string full = ValidFile();
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) {
      bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xff);
    }
    absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(bytes);
    if (!index.ok()) {
      ++rejected;
      EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(rejected, 1000);  // the header is most of the file
}

// The fuzzer's seed files stay what their names say: valid_* parse,
// bad_* are rejected.
TEST(SafetensorsMalformedTest, FuzzSeedsAreWhatTheirNamesSay) {
  const char* source = std::getenv("PIPETRAIN_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "PIPETRAIN_SOURCE_DIR is set by ctest";
  const std::filesystem::path dir =
      std::filesystem::path(source) / "fuzz/corpus/safetensors";
  int valid = 0, bad = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    absl::StatusOr<std::string> bytes =
        ReadRegularFile(e.path().string(), 1 << 20);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const absl::Status status = ParseSafetensors(*bytes).status();
    if (absl::StartsWith(name, "valid_")) {
      EXPECT_TRUE(status.ok()) << name << ": " << status;
      ++valid;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
      ++bad;
    }
  }
  EXPECT_GE(valid, 3);
  EXPECT_GE(bad, 10);
}

}  // namespace
}  // namespace pipetrain
