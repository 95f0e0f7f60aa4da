#include "common/secret.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ConstantTimeEqualsTest, ComparesBytesAndLengths) {
  EXPECT_TRUE(ConstantTimeEquals("s3cret", "s3cret"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3creT"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3cre"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(RandomSecretTest, HexOfTheAskedLengthAndFresh) {
  absl::StatusOr<std::string> a = RandomSecret(16);
  absl::StatusOr<std::string> b = RandomSecret(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
}

TEST(ReadSecretFileTest, SkipsCommentsAndBlanksAndTrims) {
  const std::string path = testing::TempDir() + "/join_token";
  std::ofstream(path) << "# the cluster's join token\n\n   tok-123  \nnext\n";
  absl::StatusOr<std::string> secret = ReadSecretFile("join_token_file", path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(*secret, "tok-123");

  std::ofstream(path) << "# only a comment\n";
  secret = ReadSecretFile("join_token_file", path);
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(secret.status().message().find("--join_token_file"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_FALSE(ReadSecretFile("join_token_file", path).ok());
}

}  // namespace
}  // namespace pipetrain
