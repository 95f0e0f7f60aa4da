// The one place where absl::Status and grpc::Status meet, plus the channel
// and server settings every pipetrain endpoint shares (keepalive, message
// limits).
#ifndef PIPETRAIN_SERVICES_GRPC_UTIL_H_
#define PIPETRAIN_SERVICES_GRPC_UTIL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace pipetrain {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Largest unary message (weights of a big stage travel in one).
inline constexpr int kMaxUnaryMessageBytes = 1 << 30;

// Keepalive on, raised message limits.
grpc::ChannelArguments DefaultChannelArguments();
std::shared_ptr<grpc::Channel> CreatePipetrainChannel(
    const std::string& target);
// Applies the same limits and keepalive policy to a server.
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

// Builds and starts a server for `service` (borrowed) on `address` with the
// shared settings and the standard grpc.health.v1 service; `port` receives
// the bound port. Unavailable when the address is taken or invalid.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, grpc::Service* service, int* port);

// A deadline `seconds` from now, for unary calls.
std::chrono::system_clock::time_point DeadlineIn(double seconds);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_GRPC_UTIL_H_
