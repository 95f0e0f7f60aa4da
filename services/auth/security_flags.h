// The transport-security flags every pipetrain binary takes (--tls_cert,
// --tls_key, --tls_ca, --insecure) and the start-up check they drive:
// plaintext only where every address is loopback, or with --insecure,
// which logs a warning.
#ifndef PIPETRAIN_SERVICES_AUTH_SECURITY_FLAGS_H_
#define PIPETRAIN_SERVICES_AUTH_SECURITY_FLAGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/rpc/transport_security.h"

namespace pipetrain {

// (flag, address) pairs a process listens on or dials at start.
using NamedAddresses = std::vector<std::pair<std::string, std::string>>;

// Builds the TransportSecurity the flags describe, checks `addresses`
// against it (FailedPrecondition naming the first that would carry
// plaintext off loopback), installs it for the process and returns it.
// Call once in main(). Servers warn about plaintext on loopback too;
// clients (`client` true) only about --insecure.
absl::StatusOr<TransportSecurity> SetUpTransportSecurityFromFlags(
    const NamedAddresses& addresses, bool client = false);

// --insecure.
bool InsecureFlag();

// --tls_cert and --tls_key: what the process's HTTPS endpoints (REST,
// /metrics) serve. Both empty without TLS.
std::string TlsCertFlag();
std::string TlsKeyFlag();

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_AUTH_SECURITY_FLAGS_H_
