#include "services/rpc/transport_security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace pipetrain {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& flag,
                                    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " holds no PEM block"));
  }
  return text.str();
}

// The host part of "host:port", "[v6]:port", "host" or gRPC's
// "ipv4:host:port" / "ipv6:[host]:port" peer strings.
std::string HostOf(std::string address) {
  for (const char* scheme : {"ipv4:", "ipv6:", "dns:///", "dns:"}) {
    if (absl::StartsWith(address, scheme)) {
      address = address.substr(std::string(scheme).size());
      break;
    }
  }
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    return address.substr(
        1, close == std::string::npos ? std::string::npos : close - 1);
  }
  const size_t colon = address.rfind(':');
  // More than one colon without brackets: a bare IPv6 address.
  if (colon != std::string::npos && address.find(':') == colon) {
    return address.substr(0, colon);
  }
  return address;
}

TransportSecurity& ProcessSecurity() {
  static TransportSecurity* security = new TransportSecurity();
  return *security;
}

}  // namespace

absl::StatusOr<TransportSecurity> TransportSecurity::Create(
    const TransportSecurityOptions& options) {
  TransportSecurity out;
  out.insecure_ = options.insecure;
  const int given = !options.cert_file.empty() + !options.key_file.empty() +
                    !options.ca_file.empty();
  if (given == 0) return out;
  if (given != 3) {
    return absl::InvalidArgumentError(
        "--tls_cert, --tls_key and --tls_ca go together (mutual TLS needs "
        "this process's certificate, its key and the cluster's CA)");
  }
  auto cert = ReadPem("tls_cert", options.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("tls_key", options.key_file);
  if (!key.ok()) return key.status();
  auto ca = ReadPem("tls_ca", options.ca_file);
  if (!ca.ok()) return ca.status();
  out.cert_ = *std::move(cert);
  out.key_ = *std::move(key);
  out.ca_ = *std::move(ca);
  return out;
}

std::shared_ptr<grpc::ServerCredentials> TransportSecurity::ServerCredentials()
    const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_;
  options.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials>
TransportSecurity::ChannelCredentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_;
  options.pem_private_key = key_;
  options.pem_cert_chain = cert_;
  return grpc::SslCredentials(options);
}

absl::Status TransportSecurity::CheckAddress(const std::string& flag,
                                             const std::string& address) const {
  if (tls() || insecure_ || IsLoopbackAddress(address)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      flag, " ", address,
      " is not a loopback address and would carry plaintext: give "
      "--tls_cert, --tls_key and --tls_ca (mutual TLS with the cluster's CA), "
      "or --insecure to allow plaintext on the network anyway"));
}

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:")) return true;
  const std::string host = HostOf(address);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

void InstallProcessTransportSecurity(const TransportSecurity& security) {
  ProcessSecurity() = security;
}

const TransportSecurity& ProcessTransportSecurity() {
  return ProcessSecurity();
}

std::string PeerIdentity::Primary() const {
  return names.empty() ? std::string() : names.front();
}

bool PeerIdentity::Has(const std::string& name) const {
  if (name.empty()) return false;
  for (const std::string& n : names) {
    if (n == name) return true;
  }
  return false;
}

PeerIdentity PeerOf(const grpc::ServerContextBase& context) {
  PeerIdentity out;
  out.address = context.peer();
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    out.authenticated = true;
    for (const char* property :
         {"x509_common_name", "x509_subject_alternative_name"}) {
      for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
        std::string name(v.data(), v.size());
        if (!out.Has(name)) out.names.push_back(std::move(name));
      }
    }
    return out;
  }
  out.names.push_back(HostOf(out.address));
  return out;
}

}  // namespace pipetrain
