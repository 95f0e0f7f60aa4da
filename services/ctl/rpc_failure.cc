#include "services/ctl/rpc_failure.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace pipetrain {
namespace ctl {
namespace {

std::string OneLine(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"\r\n", "; "}, {"\n", "; "}});
}

// "failed precondition" for FAILED_PRECONDITION.
std::string CodeWords(absl::StatusCode code) {
  return absl::AsciiStrToLower(
      absl::StrReplaceAll(absl::StatusCodeToString(code), {{"_", " "}}));
}

}  // namespace

std::string DescribeRpcFailure(const absl::Status& status,
                               const RpcFailureContext& context) {
  const std::string message = OneLine(status.message());
  const bool transport = status.code() == absl::StatusCode::kUnavailable ||
                         status.code() == absl::StatusCode::kDeadlineExceeded;
  if (transport && !context.connected) {
    return absl::StrCat("cannot reach the scheduler at ", context.target,
                        " (is pipetrain-scheduler running? set --scheduler or "
                        "PIPETRAIN_SCHEDULER)");
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::StrFormat(
        "the scheduler at %s did not answer within %gs (raise --timeout)",
        context.target, context.timeout_seconds);
  }
  if (status.code() == absl::StatusCode::kUnimplemented) {
    // A worker's port, a metrics port, or a scheduler of another version.
    std::string out = absl::StrCat(
        "the server at ", context.target,
        " does not serve this SchedulerService call (is --scheduler the "
        "gRPC address of a pipetrain-scheduler?)");
    if (!message.empty()) absl::StrAppend(&out, ": ", message);
    return out;
  }
  if (status.code() == absl::StatusCode::kNotFound && !context.job_id.empty() &&
      (message.empty() || absl::StrContains(message, context.job_id))) {
    return absl::StrCat("no job '", context.job_id, "'");
  }
  if (message.empty()) return CodeWords(status.code());
  return absl::StrCat(message, " (", CodeWords(status.code()), ")");
}

}  // namespace ctl
}  // namespace pipetrain
