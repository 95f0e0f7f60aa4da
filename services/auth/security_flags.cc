#include "services/auth/security_flags.h"

#include "absl/flags/flag.h"
#include "common/logging.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this process (mutual TLS; with --tls_key "
          "and --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM certificate of the cluster's CA: peers must present a "
          "certificate it signed");
ABSL_FLAG(bool, insecure, false,
          "Allow plaintext and open access on non-loopback addresses "
          "(no TLS, no tokens): for trusted networks only");

namespace pipetrain {

bool InsecureFlag() { return absl::GetFlag(FLAGS_insecure); }
std::string TlsCertFlag() { return absl::GetFlag(FLAGS_tls_cert); }
std::string TlsKeyFlag() { return absl::GetFlag(FLAGS_tls_key); }

absl::StatusOr<TransportSecurity> SetUpTransportSecurityFromFlags(
    const NamedAddresses& addresses, bool client) {
  TransportSecurityOptions options;
  options.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.key_file = absl::GetFlag(FLAGS_tls_key);
  options.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.insecure = InsecureFlag();
  absl::StatusOr<TransportSecurity> security =
      TransportSecurity::Create(options);
  if (!security.ok()) return security.status();
  for (const auto& [flag, address] : addresses) {
    if (address.empty()) continue;
    absl::Status allowed = security->CheckAddress(flag, address);
    if (!allowed.ok()) return allowed;
  }
  if (!security->tls()) {
    if (security->insecure()) {
      PT_LOG(WARNING) << "--insecure: gRPC and HTTP traffic is plaintext "
                         "and peers are not authenticated; anyone who can "
                         "reach these ports can read and steer training";
    } else if (!client) {
      PT_LOG(WARNING) << "no --tls_cert: plaintext gRPC and HTTP on "
                         "loopback only; peer identity checks are off";
    }
  }
  InstallProcessTransportSecurity(*security);
  return security;
}

}  // namespace pipetrain
