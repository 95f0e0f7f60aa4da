#include "common/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/durable_file.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FloatBytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());  // x86 is little-endian
  return out;
}

std::vector<float> Floats(absl::string_view bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  const std::string w = FloatBytes({1, 2, 3, 4, 5, 6});
  const std::string b = FloatBytes({-0.5f, 0.25f});
  const std::vector<SafetensorsTensorView> tensors = {
      {"layers.0.weight", SafetensorsDtype::kF32, {2, 3}, w},
      {"layers.0.bias", SafetensorsDtype::kF32, {2}, b}};
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors(tensors, {{"step", "7"}, {"note", "héllo"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("step"), "7");
  EXPECT_EQ(file->metadata().at("note"), "héllo");
  ASSERT_EQ(file->tensors().size(), 2u);
  const SafetensorsEntry* weight = file->Find("layers.0.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->dtype, SafetensorsDtype::kF32);
  EXPECT_THAT(weight->shape, ElementsAre(2, 3));
  EXPECT_THAT(Floats(file->Data(*weight)), ElementsAre(1, 2, 3, 4, 5, 6));
  const SafetensorsEntry* bias = file->Find("layers.0.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_THAT(Floats(file->Data(*bias)), ElementsAre(-0.5f, 0.25f));
  EXPECT_EQ(file->Find("layers.1.bias"), nullptr);
}

// The exact bytes the reference writer produces for a small file: key
// order, no spaces, header padded with spaces to a multiple of 8.
TEST(SafetensorsTest, WritesTheReferenceLayout) {
  const std::string a = FloatBytes({1.0f});
  absl::StatusOr<std::string> bytes = SerializeSafetensors(
      {{"a", SafetensorsDtype::kF32, {1}, a}}, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string json =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1],)"
      R"("data_offsets":[0,4]}})";
  ASSERT_EQ(json.size(), 79u);
  const std::string padded = json + " ";  // to 80
  std::string expected(8, '\0');
  expected[0] = static_cast<char>(padded.size());
  expected += padded + a;
  EXPECT_EQ(*bytes, expected);
}

TEST(SafetensorsTest, AlignsMixedDtypesByElementSize) {
  const std::string i64(16, '\x01');
  const std::string f16(6, '\x02');
  const std::string f32(4, '\x03');
  const std::string u8(3, '\x04');
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors({{"d_u8", SafetensorsDtype::kU8, {3}, u8},
                            {"c_f16", SafetensorsDtype::kF16, {3}, f16},
                            {"b_f32", SafetensorsDtype::kF32, {1}, f32},
                            {"a_i64", SafetensorsDtype::kI64, {2}, i64}},
                           {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> order;
  for (const SafetensorsEntry& e : file->tensors()) {
    order.push_back(e.name);
    EXPECT_EQ(e.offset % SafetensorsDtypeSize(e.dtype), 0u) << e.name;
  }
  EXPECT_THAT(order, ElementsAre("a_i64", "b_f32", "c_f16", "d_u8"));
  EXPECT_EQ(file->Data(*file->Find("c_f16")), f16);
  EXPECT_EQ(file->Data(*file->Find("d_u8")), u8);
}

TEST(SafetensorsTest, EmptyFileAndZeroSizedTensors) {
  absl::StatusOr<std::string> empty = SerializeSafetensors({}, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 16u);  // length + "{}" padded to 8
  EXPECT_TRUE(SafetensorsFile::FromBytes(*empty).ok());

  const std::string one = FloatBytes({3.0f});
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors({{"z1", SafetensorsDtype::kF32, {0, 5}, ""},
                            {"one", SafetensorsDtype::kF32, {}, one},
                            {"z2", SafetensorsDtype::kF32, {4, 0}, ""}},
                           {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->Find("z1")->shape, ElementsAre(0, 5));
  EXPECT_EQ(file->Find("z2")->size, 0u);
  EXPECT_THAT(file->Find("one")->shape, ElementsAre());
  EXPECT_THAT(Floats(file->Data(*file->Find("one"))), ElementsAre(3.0f));
}

TEST(SafetensorsTest, WriterRejectsBadTensors) {
  const std::string four = FloatBytes({1, 2, 3, 4});
  struct Case {
    std::vector<SafetensorsTensorView> tensors;
    SafetensorsMetadata metadata;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"", SafetensorsDtype::kF32, {4}, four}}, {}, "empty name"},
      {{{"__metadata__", SafetensorsDtype::kF32, {4}, four}},
       {},
       "__metadata__"},
      {{{"a", SafetensorsDtype::kF32, {4}, four},
        {"a", SafetensorsDtype::kF32, {4}, four}},
       {},
       "appears twice"},
      {{{"a", SafetensorsDtype::kF32, {3}, four}}, {}, "need 12"},
      {{{"a", SafetensorsDtype::kF32, {-4}, four}}, {}, "negative"},
      {{{"a", SafetensorsDtype::kF32, {1LL << 40, 1LL << 40}, four}},
       {},
       "overflows"},
      {{{"bad\xff", SafetensorsDtype::kF32, {4}, four}}, {}, "UTF-8"},
      {{}, {{"k", "\xc3"}}, "UTF-8"},
  };
  for (const Case& c : cases) {
    std::string written;
    const absl::Status status =
        WriteSafetensors(c.tensors, c.metadata, [&](absl::string_view p) {
          written.append(p.data(), p.size());
          return absl::OkStatus();
        });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_TRUE(written.empty()) << "wrote before validating: " << c.message;
  }
}

TEST(SafetensorsTest, ReadsFilesAndNamesThemInErrors) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/m.safetensors";
  const std::string w = FloatBytes({1, 2});
  ASSERT_TRUE(WriteFileAtomically(path, [&](const ByteSink& sink) {
                return WriteSafetensors({{"w", SafetensorsDtype::kF32, {2}, w}},
                                        {}, sink);
              }).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensorsFile(path, 1 << 20);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(Floats(file->Data(*file->Find("w"))), ElementsAre(1, 2));

  EXPECT_EQ(ReadSafetensorsFile(path, 10).status().code(),
            absl::StatusCode::kInvalidArgument);  // over the cap
  const std::string bad = dir.path() + "/bad.safetensors";
  ASSERT_TRUE(WriteFileAtomically(bad, "not a safetensors file").ok());
  absl::StatusOr<SafetensorsFile> b = ReadSafetensorsFile(bad, 1 << 20);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr(bad + ": safetensors: "));
}

TEST(SafetensorsTest, DtypeNamesRoundTrip) {
  for (const char* name :
       {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
        "I32", "U32", "F32", "F64", "I64", "U64"}) {
    absl::StatusOr<SafetensorsDtype> dtype = SafetensorsDtypeFromName(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(SafetensorsDtypeName(*dtype), name);
  }
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kBF16), 2u);
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kI64), 8u);
  EXPECT_FALSE(SafetensorsDtypeFromName("f32").ok());
}

}  // namespace
}  // namespace pipetrain
