// The one place where absl::Status and grpc::Status meet, plus the channel
// settings every pipetrain client shares (keepalive, message limits,
// flow-control windows). Servers take the same settings from grpc_server.h.
#ifndef PIPETRAIN_SERVICES_RPC_GRPC_UTIL_H_
#define PIPETRAIN_SERVICES_RPC_GRPC_UTIL_H_

#include <chrono>
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
// Flow-control window per stream: a stage streams tens of MiB per step.
inline constexpr int kStreamWindowBytes = 64 << 20;
// HTTP/2 DATA frames up to 1 MiB (the default 16 KiB costs a frame header
// and a parse per 16 KiB of activations).
inline constexpr int kHttp2FrameBytes = 1 << 20;

// Keepalive on, raised message limits.
grpc::ChannelArguments DefaultChannelArguments();
// A channel with the shared settings and the process's credentials
// (transport_security.h), or explicit ones.
std::shared_ptr<grpc::Channel> CreatePipetrainChannel(
    const std::string& target);
std::shared_ptr<grpc::Channel> CreatePipetrainChannel(
    const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> credentials);

// A deadline `seconds` from now, for unary calls.
std::chrono::system_clock::time_point DeadlineIn(double seconds);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_RPC_GRPC_UTIL_H_
