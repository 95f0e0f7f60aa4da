// The .npy header parser on hand-made headers (each rule in isolation) and
// on fuzz/corpus/npy/ (written by NumPy; valid_* parse, bad_* do not).
#include "worker/data/npy_header.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A version-1.0 file: magic, version, little-endian length, dict, data.
std::string File(const std::string& dict, const std::string& data,
                 int major = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const size_t n = dict.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) out += std::string(2, '\0');
  return out + dict + data;
}

std::string Error(const std::string& file) {
  absl::StatusOr<NpyHeader> h = ParseNpyFile(file, "x.npy");
  EXPECT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("x.npy"));
  return std::string(h.status().message());
}

TEST(NpyHeaderTest, AcceptsWhatNumpyAndPythonMayWrite) {
  const std::string data(24, '\0');
  for (const std::string& dict :
       {std::string("{'descr': '<f4', 'fortran_order': False, "
                    "'shape': (2, 3), }      \n"),
        std::string("{\"shape\": (2L, 3L), \"descr\": \"<i4\", "
                    "\"fortran_order\": False}\n")}) {
    absl::StatusOr<NpyHeader> h = ParseNpyFile(File(dict, data), "x.npy");
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_THAT(h->shape, ElementsAre(2, 3));
    EXPECT_EQ(h->elements, 6);
    EXPECT_EQ(h->data_offset, 10 + static_cast<int64_t>(dict.size()));
  }
  absl::StatusOr<NpyHeader> v2 = ParseNpyFile(
      File("{'descr': '|u1', 'fortran_order': False, 'shape': (5,)}", "abcde",
           2),
      "x.npy");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->dtype, NpyDtype::kUint8);
  EXPECT_EQ(v2->data_offset, 12 + 55);
  absl::StatusOr<NpyHeader> scalar =
      ParseNpyFile(File("{'descr': '<i8', 'fortran_order': False, 'shape': ()}",
                        std::string(8, '\x07')),
                   "x.npy");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->elements, 1);
  EXPECT_EQ(NpyIntegerAt(reinterpret_cast<const uint8_t*>(
                             File("", std::string(8, '\x07')).data() + 10),
                         NpyDtype::kInt64, 0),
            0x0707070707070707);
}

TEST(NpyHeaderTest, RefusesEachMalformedPart) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, ";
  const std::string data(8, '\0');
  EXPECT_THAT(Error("\x93NUMPX\x01\x00\x00\x00"), HasSubstr("magic"));
  EXPECT_THAT(Error(File(ok + "'shape': (2,)}", data, 4)),
              HasSubstr("version 4.0"));
  std::string long_length = File(ok + "'shape': (2,)}", data);
  long_length[8] = '\xff';
  EXPECT_THAT(Error(long_length), HasSubstr("shorter than its .npy header"));
  EXPECT_THAT(Error(File(ok + "'shape': (2,)}", data + "x")),
              HasSubstr("trailing bytes"));
  EXPECT_THAT(Error(File(ok + "'shape': (3,)}", data)),
              HasSubstr("(cut short)"));
  EXPECT_THAT(Error(File(ok + "'shape': (-2,)}", data)),
              HasSubstr("expected a dimension"));
  EXPECT_THAT(Error(File(ok + "'shape': (2,), 'extra': 1}", data)),
              HasSubstr("unexpected or repeated key 'extra'"));
  EXPECT_THAT(Error(File(ok + "'fortran_order': False, 'shape': (2,)}", data)),
              HasSubstr("repeated key 'fortran_order'"));
  EXPECT_THAT(Error(File("{'descr': '<f4', 'shape': (2,)}", data)),
              HasSubstr("missing"));
  EXPECT_THAT(Error(File(ok + "'shape': (2,)} x", data)),
              HasSubstr("text after the dict"));
  EXPECT_THAT(Error(File(ok + "'shape': (2,", data)),
              HasSubstr("expected a dimension"));
  EXPECT_THAT(
      Error(File("{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}",
                 data)),
      HasSubstr("unsupported dtype '<f8'"));
  EXPECT_THAT(
      Error(File("{'descr': '>i4', 'fortran_order': False, 'shape': (2,)}",
                 data)),
      HasSubstr("big-endian"));
  EXPECT_THAT(
      Error(
          File("{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}", data)),
      HasSubstr("fortran_order is True"));
  EXPECT_THAT(Error(File(ok + "'shape': (4294967296, 4294967296)}", data)),
              HasSubstr("too large"));
}

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(NpyHeaderTest, FuzzSeedsParseAsNamed) {
  const char* source = std::getenv("PIPETRAIN_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "PIPETRAIN_SOURCE_DIR is set by ctest";
  int valid = 0, bad = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           absl::StrCat(source, "/fuzz/corpus/npy"))) {
    const std::string name = entry.path().filename().string();
    const bool ok = ParseNpyFile(Read(entry.path()), name).ok();
    EXPECT_EQ(ok, absl::StartsWith(name, "valid_")) << name;
    ++(ok ? valid : bad);
  }
  EXPECT_GE(valid, 5);
  EXPECT_GE(bad, 5);
}

}  // namespace
}  // namespace pipetrain
