// A streaming call refused before it starts: the reactor a handler returns
// when the caller may not make the call. It finishes at once with `status`
// and deletes itself when gRPC is done with it.
//
//   return new RefusedCall<grpc::ServerWriteReactor<v1::StateChunk>>(status);
#ifndef PIPETRAIN_SERVICES_RPC_REFUSED_CALL_H_
#define PIPETRAIN_SERVICES_RPC_REFUSED_CALL_H_

#include "grpcpp/grpcpp.h"

namespace pipetrain {

// Reactor: grpc::ServerReadReactor<T>, ServerWriteReactor<T> or
// ServerBidiReactor<In, Out>.
template <typename Reactor>
class RefusedCall final : public Reactor {
 public:
  explicit RefusedCall(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_RPC_REFUSED_CALL_H_
