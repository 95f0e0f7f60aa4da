// Handling shared secrets (tokens, per-registration secrets): comparison in
// constant time, so a caller cannot learn a secret byte by byte from how
// long a rejection takes, and fresh random ones from OpenSSL's CSPRNG.
// Secrets are never logged; callers name the file or line, not the value.
#ifndef PIPETRAIN_COMMON_SECRET_H_
#define PIPETRAIN_COMMON_SECRET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// Equal lengths and bytes. The time depends on the lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// `bytes` random bytes as lower-case hex. Internal when the CSPRNG fails.
absl::StatusOr<std::string> RandomSecret(int bytes = 32);

// The secret in `path`: its first line that is neither blank nor a '#'
// comment, without surrounding whitespace. InvalidArgument naming `flag`
// when the file cannot be read or holds none.
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag,
                                           const std::string& path);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SECRET_H_
