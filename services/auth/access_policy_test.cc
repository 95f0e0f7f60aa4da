#include "services/auth/access_policy.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr char kTokens[] =
    "# who may call the scheduler\n"
    "\n"
    "view-tok viewer\n"
    "  op-tok\toperator  \n";

ApiAuthorizer Authorizer() {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(kTokens, "tokens");
  EXPECT_TRUE(table.ok()) << table.status();
  return ApiAuthorizer(*table);
}

TEST(TokenTableTest, ParsesRolesSkippingCommentsAndBlanks) {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(kTokens, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  EXPECT_EQ(table->Find("view-tok"), Role::kViewer);
  EXPECT_EQ(table->Find("op-tok"), Role::kOperator);
  EXPECT_FALSE(table->Find("op-to").has_value());
  EXPECT_FALSE(table->Find("").has_value());
}

TEST(TokenTableTest, BadLinesNameTheLineNotTheToken) {
  for (const char* text :
       {"ok viewer\nsupersecret admin\n", "ok viewer\nsupersecret\n",
        "ok viewer\nsupersecret viewer extra\n", "ok viewer\nok operator\n"}) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens.txt");
    ASSERT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_NE(table.status().message().find("tokens.txt:2:"), std::string::npos)
        << table.status();
    EXPECT_EQ(table.status().message().find("supersecret"), std::string::npos);
    EXPECT_EQ(table.status().message().find("ok "), std::string::npos);
  }
  EXPECT_FALSE(TokenTable::Parse("# nothing\n", "t").ok());
}

TEST(ApiAuthorizerTest, MissingOrUnknownTokenIsUnauthenticated) {
  const ApiAuthorizer auth = Authorizer();
  EXPECT_EQ(auth.Authorize("", "ListJobs").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("Bearer nope", "ListJobs").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("Basic op-tok", "ListJobs").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("op-tok", "ListJobs").code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(ApiAuthorizerTest, RoleMatrix) {
  const ApiAuthorizer auth = Authorizer();
  for (const char* read :
       {"GetJob", "ListJobs", "ListWorkers", "GetPlan", "GetVersions",
        "GetJobTrace", "ListCheckpoints", "Metrics"}) {
    EXPECT_TRUE(auth.Authorize("Bearer view-tok", read).ok()) << read;
    EXPECT_TRUE(auth.Authorize("bearer op-tok", read).ok()) << read;
  }
  for (const char* write :
       {"SubmitJob", "PauseJob", "ResumeJob", "CancelJob", "Evaluate",
        "CheckpointJob", "ExportModel", "RemoveWorker"}) {
    EXPECT_EQ(auth.Authorize("Bearer view-tok", write).code(),
              absl::StatusCode::kPermissionDenied)
        << write;
    EXPECT_TRUE(auth.Authorize("Bearer op-tok", write).ok()) << write;
  }
}

TEST(ApiAuthorizerTest, MethodsWithoutARuleAreRefused) {
  EXPECT_EQ(Authorizer().Authorize("Bearer op-tok", "DropDatabase").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ApiAuthorizer().Authorize("", "DropDatabase").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(ApiAuthorizerTest, OpenWithoutTokensAndWorkerCallsPass) {
  const ApiAuthorizer open;
  EXPECT_TRUE(open.open());
  EXPECT_TRUE(open.Authorize("", "CancelJob").ok());
  EXPECT_TRUE(Authorizer().Authorize("", "Heartbeat").ok());
  EXPECT_TRUE(Authorizer().Authorize("", "RegisterWorker").ok());
}

}  // namespace
}  // namespace pipetrain
