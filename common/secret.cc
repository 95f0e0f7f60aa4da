#include "common/secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> RandomSecret(int bytes) {
  std::vector<unsigned char> buffer(bytes);
  if (RAND_bytes(buffer.data(), bytes) != 1) {
    return absl::InternalError("the system's random generator failed");
  }
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(buffer.data()), buffer.size()));
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& flag,
                                           const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read ", path));
  }
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    return std::string(text);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": ", path, " holds no secret"));
}

}  // namespace pipetrain
