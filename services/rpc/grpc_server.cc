#include "services/rpc/grpc_server.h"

#include "absl/strings/str_cat.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/transport_security.h"

namespace pipetrain {

void ConfigureServerBuilder(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxUnaryMessageBytes);
  builder->SetMaxSendMessageSize(kMaxUnaryMessageBytes);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                              kStreamWindowBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, grpc::Service* service, int* port) {
  return StartGrpcServer(address, service, port,
                         ProcessTransportSecurity().ServerCredentials());
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, grpc::Service* service, int* port,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  *port = 0;
  builder.AddListeningPort(address, std::move(credentials), port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address,
                                               " (address in use or invalid)"));
  }
  return server;
}

}  // namespace pipetrain
