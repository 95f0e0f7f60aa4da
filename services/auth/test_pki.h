// Test-only: a throwaway certificate authority and the certificates a test
// cluster needs, made with the openssl command in a directory the test
// owns, so no private key lives in the repository.
#ifndef PIPETRAIN_SERVICES_AUTH_TEST_PKI_H_
#define PIPETRAIN_SERVICES_AUTH_TEST_PKI_H_

#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

struct CertFiles {
  std::string cert;
  std::string key;
  std::string ca;  // the CA that signed `cert`
};

// Not thread-safe; each test owns its own.
class TestPki {
 public:
  // Creates a CA named `ca_name` under `dir` (which must exist).
  static absl::StatusOr<TestPki> Create(const std::string& dir,
                                        const std::string& ca_name);
  // A certificate with subject CN=`common_name` and SANs DNS:localhost,
  // IP:127.0.0.1 and DNS:`common_name`, good for client and server use.
  absl::StatusOr<CertFiles> Issue(const std::string& common_name) const;

  const std::string& ca_file() const { return ca_cert_; }

 private:
  std::string dir_, ca_cert_, ca_key_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_AUTH_TEST_PKI_H_
