// The C++ writer and reader against an independent implementation of the
// format in Python (numpy + json + struct, common/testdata/
// safetensors_reference.py). Fails when python3 or numpy is missing
// (Debian python3-numpy, installed by deploy/setup.sh).
#include <stdio.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::string Script() {
  const char* source = std::getenv("PIPETRAIN_SOURCE_DIR");
  EXPECT_NE(source, nullptr) << "PIPETRAIN_SOURCE_DIR is set by ctest";
  return absl::StrCat(source == nullptr ? "." : source,
                      "/common/testdata/safetensors_reference.py");
}

// Runs the reference script; its stdout, or a test failure.
std::string RunPython(const std::string& mode, const std::string& path) {
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", Script(), " ", mode, " ", path);
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << " failed (is python3-numpy installed?)";
  return out;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());  // little-endian host
  return out;
}

template <typename T>
std::vector<T> Values(absl::string_view bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

TEST(SafetensorsPythonTest, PythonReadsWhatCppWrites) {
  std::vector<float> weight(12);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.1f * i - 0.37f;
  const std::vector<float> bias = {1e-7f, -3.5f, 1e30f};
  const std::vector<int64_t> ints = {-5, 0, 1LL << 50};
  // bf16 of 1.0, -2.0, 0.15625: the high halves of their float32 bits.
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x3e20};
  const std::string w = Bytes(weight), b = Bytes(bias), i = Bytes(ints),
                    h = Bytes(bf16);
  ScopedTempDir dir;
  const std::string path = dir.path() + "/cpp.safetensors";
  absl::StatusOr<std::string> bytes = SerializeSafetensors(
      {{"layers.0.weight", SafetensorsDtype::kF32, {3, 4}, w},
       {"layers.0.bias", SafetensorsDtype::kF32, {3}, b},
       {"steps", SafetensorsDtype::kI64, {3}, i},
       {"half", SafetensorsDtype::kBF16, {1, 3}, h}},
      {{"step", "42"}, {"model_spec", R"({"layers":[{"linear":{}}]})"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_TRUE(WriteFileAtomically(path, *bytes).ok());

  const nlohmann::json read =
      nlohmann::json::parse(RunPython("read", path), nullptr, false);
  ASSERT_FALSE(read.is_discarded());
  EXPECT_EQ(read["metadata"]["step"], "42");
  EXPECT_EQ(read["metadata"]["model_spec"], R"({"layers":[{"linear":{}}]})");
  ASSERT_EQ(read["tensors"].size(), 4u);
  const nlohmann::json& tw = read["tensors"]["layers.0.weight"];
  EXPECT_EQ(tw["dtype"], "F32");
  EXPECT_EQ(tw["shape"].get<std::vector<int64_t>>(),
            (std::vector<int64_t>{3, 4}));
  std::vector<double> expected_w(weight.begin(), weight.end());  // exact
  EXPECT_EQ(tw["values"].get<std::vector<double>>(), expected_w);
  std::vector<double> expected_b(bias.begin(), bias.end());
  EXPECT_EQ(
      read["tensors"]["layers.0.bias"]["values"].get<std::vector<double>>(),
      expected_b);
  EXPECT_EQ(read["tensors"]["steps"]["values"].get<std::vector<int64_t>>(),
            ints);
  EXPECT_EQ(read["tensors"]["half"]["shape"].get<std::vector<int64_t>>(),
            (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(read["tensors"]["half"]["values"].get<std::vector<double>>(),
            (std::vector<double>{1.0, -2.0, 0.15625}));
}

TEST(SafetensorsPythonTest, CppReadsWhatPythonWrites) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/py.safetensors";
  RunPython("write", path);
  absl::StatusOr<SafetensorsFile> file = ReadSafetensorsFile(path, 1 << 20);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("written_by"), "numpy");
  EXPECT_EQ(file->metadata().at("step"), "12");
  ASSERT_EQ(file->tensors().size(), 5u);

  const SafetensorsEntry* w = file->Find("layers.1.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, SafetensorsDtype::kF32);
  EXPECT_THAT(w->shape, ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(file->Data(*w)),
              ElementsAre(-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f));
  const SafetensorsEntry* b = file->Find("layers.1.bias");
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(Values<float>(file->Data(*b)), ElementsAre(1e-3f, -2.5f));
  const SafetensorsEntry* c = file->Find("counts");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, SafetensorsDtype::kI64);
  EXPECT_THAT(Values<int64_t>(file->Data(*c)), ElementsAre(-1, 0, 1LL << 40));
  const SafetensorsEntry* h = file->Find("half");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype, SafetensorsDtype::kF16);
  EXPECT_THAT(h->shape, ElementsAre(2, 2));
  // IEEE half bit patterns of 0.5, 1.0, 1.5, -2.0.
  EXPECT_THAT(Values<uint16_t>(file->Data(*h)),
              ElementsAreArray({0x3800, 0x3c00, 0x3e00, 0xc000}));
  const SafetensorsEntry* m = file->Find("mask");
  ASSERT_NE(m, nullptr);
  EXPECT_THAT(Values<uint8_t>(file->Data(*m)), ElementsAre(0, 1, 255));
}

}  // namespace
}  // namespace pipetrain
