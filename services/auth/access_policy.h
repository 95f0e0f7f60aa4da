// Who may call what on the scheduler's control API, for gRPC and REST
// alike: one table from method name (the SchedulerService method, which
// every REST route names too) to the access it needs, and the bearer tokens
// that carry a role.
//
// A method missing from the table is refused, so a new call is closed until
// its line is added to kMethodAccess in access_policy.cc.
#ifndef PIPETRAIN_SERVICES_AUTH_ACCESS_POLICY_H_
#define PIPETRAIN_SERVICES_AUTH_ACCESS_POLICY_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// Roles in increasing power; an operator may do all a viewer may.
enum class Role { kViewer = 1, kOperator = 2 };

// What a method needs.
enum class Access {
  kViewer,    // read, list, watch, metrics
  kOperator,  // change jobs and workers
  kWorker,    // worker calls, admitted by join token and identity instead
};

// NotFound for a method without a rule.
absl::StatusOr<Access> AccessFor(absl::string_view method);
// "viewer" / "operator"; InvalidArgument otherwise.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Bearer tokens and their roles, read from a file of "TOKEN ROLE" lines
// ('#' comments and blank lines allowed). Immutable; thread-safe.
class TokenTable {
 public:
  // InvalidArgument naming `source` and the line number (never the token)
  // for a malformed line, an unknown role or a repeated token.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text,
                                          const std::string& source);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The role of `token`; every entry is compared, each in constant time.
  std::optional<Role> Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Role>> entries_;
};

// Decides a control-API call. Immutable; thread-safe.
class ApiAuthorizer {
 public:
  // Open: every caller may do everything (no tokens configured; the
  // binaries allow this on loopback addresses only).
  ApiAuthorizer() = default;
  explicit ApiAuthorizer(TokenTable tokens) : tokens_(std::move(tokens)) {}

  bool open() const { return !tokens_.has_value(); }

  // `authorization` is the "Bearer TOKEN" header or metadata value (empty
  // when absent). Unauthenticated when the token is missing or unknown,
  // PermissionDenied when its role is too weak or the method has no rule.
  // Worker methods pass here; the scheduler admits those by join token.
  absl::Status Authorize(absl::string_view authorization,
                         absl::string_view method) const;

 private:
  std::optional<TokenTable> tokens_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_AUTH_ACCESS_POLICY_H_
