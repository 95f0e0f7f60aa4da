#include "services/auth/access_policy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/secret.h"

namespace pipetrain {
namespace {

// Every SchedulerService method (and the REST-only "Metrics"). Add one
// line per new method.
constexpr std::pair<absl::string_view, Access> kMethodAccess[] = {
    {"RegisterWorker", Access::kWorker},  {"Heartbeat", Access::kWorker},
    {"GetJob", Access::kViewer},          {"ListJobs", Access::kViewer},
    {"ListWorkers", Access::kViewer},     {"GetPlan", Access::kViewer},
    {"GetVersions", Access::kViewer},     {"GetJobTrace", Access::kViewer},
    {"ListCheckpoints", Access::kViewer}, {"Metrics", Access::kViewer},
    {"SubmitJob", Access::kOperator},     {"PauseJob", Access::kOperator},
    {"ResumeJob", Access::kOperator},     {"CancelJob", Access::kOperator},
    {"Evaluate", Access::kOperator},      {"CheckpointJob", Access::kOperator},
    {"ExportModel", Access::kOperator},   {"RemoveWorker", Access::kOperator},
};

}  // namespace

absl::StatusOr<Access> AccessFor(absl::string_view method) {
  for (const auto& [name, access] : kMethodAccess) {
    if (name == method) return access;
  }
  return absl::NotFoundError(
      absl::StrCat("method ", method, " has no access rule"));
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  if (name == "viewer") return Role::kViewer;
  if (name == "operator") return Role::kOperator;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (want viewer or operator)"));
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text,
                                             const std::string& source) {
  TokenTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(source, ":", line_number, ": ");
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "want 'TOKEN ROLE'"));
    }
    absl::StatusOr<Role> role = ParseRole(fields[1]);
    if (!role.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, role.status().message()));
    }
    if (table.Find(fields[0]).has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "repeats an earlier line's token"));
    }
    table.entries_.emplace_back(std::string(fields[0]), *role);
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no tokens (want 'TOKEN ROLE' lines)"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

std::optional<Role> TokenTable::Find(absl::string_view token) const {
  // No early exit: the time does not say which entry matched.
  std::optional<Role> found;
  for (const auto& [known, role] : entries_) {
    if (ConstantTimeEquals(known, token)) found = role;
  }
  return found;
}

absl::Status ApiAuthorizer::Authorize(absl::string_view authorization,
                                      absl::string_view method) const {
  absl::StatusOr<Access> access = AccessFor(method);
  if (!access.ok())
    return absl::PermissionDeniedError(access.status().message());
  if (open() || *access == Access::kWorker) return absl::OkStatus();
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return absl::UnauthenticatedError(
        "missing bearer token (send 'authorization: Bearer TOKEN')");
  }
  const absl::string_view token =
      absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  const std::optional<Role> role = tokens_->Find(token);
  if (!role.has_value()) {
    return absl::UnauthenticatedError("unknown bearer token");
  }
  if (*access == Access::kOperator && *role != Role::kOperator) {
    return absl::PermissionDeniedError(absl::StrCat(
        method, " needs the operator role; this token is a viewer"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
