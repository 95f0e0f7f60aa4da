// Starting a pipetrain gRPC server: the keepalive policy, message limits
// and flow-control windows every endpoint shares (matching the clients'
// DefaultChannelArguments), plus the standard grpc.health.v1 service.
#ifndef PIPETRAIN_SERVICES_RPC_GRPC_SERVER_H_
#define PIPETRAIN_SERVICES_RPC_GRPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace pipetrain {

// Applies the shared limits and keepalive policy to a server.
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

// Builds and starts a server for `service` (borrowed) on `address` with the
// shared settings and the standard grpc.health.v1 service; `port` receives
// the bound port. Unavailable when the address is taken or invalid.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, grpc::Service* service, int* port);
// The same with explicit credentials instead of the process's
// (transport_security.h).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, grpc::Service* service, int* port,
    std::shared_ptr<grpc::ServerCredentials> credentials);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_RPC_GRPC_SERVER_H_
