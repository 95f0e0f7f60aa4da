#include "common/durable_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

TEST(DurableFileTest, WritesAndReplacesWholeFiles) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/a.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  EXPECT_EQ(*ReadRegularFile(path, 100), "first");
  ASSERT_TRUE(WriteFileAtomically(path, [](const ByteSink& sink) {
                if (auto s = sink("sec"); !s.ok()) return s;
                return sink("ond");
              }).ok());
  EXPECT_EQ(*ReadRegularFile(path, 100), "second");
  EXPECT_EQ(Entries(dir.path()), std::vector<std::string>{"a.bin"});
}

TEST(DurableFileTest, FailedProducerLeavesOldContentAndNoTempFile) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/a.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  const absl::Status status =
      WriteFileAtomically(path, [](const ByteSink& sink) {
        if (auto s = sink("partial new content"); !s.ok()) return s;
        return absl::AbortedError("producer gave up");
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(*ReadRegularFile(path, 100), "old");
  EXPECT_EQ(Entries(dir.path()), std::vector<std::string>{"a.bin"});
}

TEST(DurableFileTest, MissingDirectoryIsAnError) {
  ScopedTempDir dir;
  const absl::Status status =
      WriteFileAtomically(dir.path() + "/no/such/a.bin", "x");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("no/such/a.bin"));
}

TEST(DurableFileTest, CreatesNestedDirectories) {
  ScopedTempDir dir;
  const std::string nested = dir.path() + "/a/b/c";
  ASSERT_TRUE(CreateDirectoriesDurably(nested).ok());
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_TRUE(CreateDirectoriesDurably(nested).ok());  // idempotent
  ASSERT_TRUE(WriteFileAtomically(dir.path() + "/file", "x").ok());
  EXPECT_EQ(CreateDirectoriesDurably(dir.path() + "/file").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DurableFileTest, ReadsOnlyRegularFilesWithinTheCap) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/a.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "0123456789").ok());
  EXPECT_EQ(*ReadRegularFile(path, 10), "0123456789");

  absl::StatusOr<std::string> big = ReadRegularFile(path, 9);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("10 bytes"));

  EXPECT_EQ(ReadRegularFile(dir.path() + "/missing", 10).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::string> d = ReadRegularFile(dir.path(), 10);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("not a regular file"));

  // A FIFO with no writer: rejected at once rather than waited on.
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> f = ReadRegularFile(fifo, 10);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr(fifo));
}

}  // namespace
}  // namespace pipetrain
