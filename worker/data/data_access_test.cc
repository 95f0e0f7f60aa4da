// Dataset files are read only from under the data roots, only when they are
// regular files, and only up to the size cap; a character corpus that names
// /dev/zero, a FIFO, a `..` or a symlink out of the root is refused before
// a byte is read.
#include "worker/data/data_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/byte_file.h"
#include "worker/data/dataset.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

class DataAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/root";
    ASSERT_EQ(::mkdir(root_.c_str(), 0700), 0);
    Write(root_ + "/corpus.txt", std::string(4000, 'a'));
    Write(dir_.path() + "/outside.txt", std::string(4000, 'b'));
    DataAccessPolicy policy;
    policy.roots = {root_};
    policy.max_file_bytes = 10000;
    ASSERT_TRUE(SetDataAccessPolicy(policy).ok());
  }
  void TearDown() override {
    ASSERT_TRUE(SetDataAccessPolicy(DataAccessPolicy()).ok());
  }
  absl::StatusCode OpenCode(const std::string& path) {
    v1::DatasetSpec spec;
    spec.mutable_char_corpus()->add_files(path);
    spec.mutable_char_corpus()->set_seq_len(8);
    const absl::Status checked = CheckDatasetFiles(spec);
    const absl::StatusCode opened = OpenDataset(spec, 1).status().code();
    EXPECT_EQ(checked.code(), opened) << path << ": " << checked;
    return opened;
  }

  ScopedTempDir dir_;
  std::string root_;
};

TEST_F(DataAccessTest, AFileUnderTheRootOpens) {
  EXPECT_EQ(OpenCode(root_ + "/corpus.txt"), absl::StatusCode::kOk);
  EXPECT_EQ(OpenCode(root_ + "/missing.txt"), absl::StatusCode::kNotFound);
}

TEST_F(DataAccessTest, PathsOutsideTheRootAreRefused) {
  EXPECT_EQ(OpenCode(dir_.path() + "/outside.txt"),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenCode(root_ + "/../outside.txt"),
            absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(::symlink((dir_.path() + "/outside.txt").c_str(),
                      (root_ + "/link.txt").c_str()),
            0);
  EXPECT_EQ(OpenCode(root_ + "/link.txt"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenCode("/dev/zero"), absl::StatusCode::kPermissionDenied);
  const absl::StatusOr<std::string> denied = CheckDataFile("/etc/passwd");
  EXPECT_THAT(denied.status().message(), HasSubstr("outside"));
  EXPECT_THAT(denied.status().message(), HasSubstr(root_));
}

TEST_F(DataAccessTest, DevicesFifosAndDirectoriesAreRefusedEvenWithoutRoots) {
  ASSERT_TRUE(SetDataAccessPolicy(DataAccessPolicy()).ok());
  EXPECT_EQ(OpenCode("/dev/zero"), absl::StatusCode::kInvalidArgument);
  const std::string fifo = dir_.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(OpenCode(fifo), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenCode(dir_.path()), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(CheckDataFile("/dev/zero").status().message(),
              HasSubstr("not a regular file"));
}

TEST_F(DataAccessTest, FilesAndCorporaOverTheCapAreRefused) {
  Write(root_ + "/big.txt", std::string(20000, 'c'));
  EXPECT_EQ(OpenCode(root_ + "/big.txt"), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(CheckDataFile(root_ + "/big.txt").status().message(),
              HasSubstr("20000 bytes, more than the limit of 10000"));
  // Three listings of one 4000-byte file make 12000 bytes in all.
  v1::DatasetSpec spec;
  for (int i = 0; i < 3; ++i) {
    spec.mutable_char_corpus()->add_files(root_ + "/corpus.txt");
  }
  spec.mutable_char_corpus()->set_seq_len(8);
  const absl::Status status = OpenDataset(spec, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("more than 10000 bytes together"));
}

}  // namespace
}  // namespace pipetrain
