#include "common/status_macros.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckPositive(int x) {
  RETURN_IF_ERROR(x > 0 ? absl::OkStatus()
                        : absl::OutOfRangeError("not positive"));
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPropagatesValuesAndErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacros, ReturnIfErrorReturnsTheError) {
  EXPECT_TRUE(CheckPositive(1).ok());
  EXPECT_EQ(CheckPositive(0).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace pipetrain
