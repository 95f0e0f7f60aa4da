// How pipetrain's gRPC endpoints protect their connections: mutual TLS with
// the cluster's CA, or plaintext where that is allowed (loopback addresses,
// or anywhere once the operator said --insecure). Also who is on the other
// end of a call (PeerIdentity), for the checks the services make.
//
//   ASSIGN_OR_RETURN(TransportSecurity security,
//                    TransportSecurity::Create(options));
//   RETURN_IF_ERROR(security.CheckAddress("--listen", listen));
//   InstallProcessTransportSecurity(security);  // once, in main()
//
// Servers started with StartGrpcServer and channels from
// CreatePipetrainChannel use the process-wide setting; code that needs
// another (tests holding several identities) passes credentials explicitly.
#ifndef PIPETRAIN_SERVICES_RPC_TRANSPORT_SECURITY_H_
#define PIPETRAIN_SERVICES_RPC_TRANSPORT_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace pipetrain {

struct TransportSecurityOptions {
  // PEM files: this process's certificate chain and key, and the CA that
  // signed every peer. All three, or none (plaintext).
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  // Plaintext is allowed on non-loopback addresses too.
  bool insecure = false;
};

// Immutable after Create; thread-safe.
class TransportSecurity {
 public:
  // Plaintext, allowed on loopback only.
  TransportSecurity() = default;
  // Reads the PEM files. InvalidArgument naming the flag when only some of
  // the three are given or one cannot be read.
  static absl::StatusOr<TransportSecurity> Create(
      const TransportSecurityOptions& options);

  bool tls() const { return !cert_.empty(); }
  bool insecure() const { return insecure_; }

  // Server side: require a client certificate signed by the CA and verify
  // it (TLS), or plaintext.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // Client side: verify the server against the CA and present our
  // certificate (TLS), or plaintext.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

  // OK when `address` may carry this process's traffic: TLS, --insecure, or
  // a loopback address. FailedPrecondition naming `flag` otherwise.
  absl::Status CheckAddress(const std::string& flag,
                            const std::string& address) const;

 private:
  std::string cert_, key_, ca_;
  bool insecure_ = false;
};

// True for 127.0.0.0/8, ::1, "localhost" and unix: sockets (with or
// without a port). "0.0.0.0", "" and "[::]" listen on every interface and
// are not loopback.
bool IsLoopbackAddress(const std::string& address);

// Sets the credentials StartGrpcServer and CreatePipetrainChannel use.
// Call once in main() before any server or channel exists; the default is
// plaintext.
void InstallProcessTransportSecurity(const TransportSecurity& security);
const TransportSecurity& ProcessTransportSecurity();

// Who called: under TLS, the names of the verified client certificate
// (its subject CN and every SAN); otherwise only the peer's host, and
// `authenticated` is false.
struct PeerIdentity {
  bool authenticated = false;
  std::vector<std::string> names;  // CN first, then SANs; or {host}
  std::string address;             // gRPC's peer string, for logs

  // The name a binding records: the CN, else the first SAN, else the host.
  std::string Primary() const;
  bool Has(const std::string& name) const;
};
PeerIdentity PeerOf(const grpc::ServerContextBase& context);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_RPC_TRANSPORT_SECURITY_H_
