// RawStream: a raw Exchange stream to a worker, as a misbehaving neighbour
// would open one, for the multi-process tests. Test-only.
#ifndef PIPETRAIN_TESTS_RAW_STREAM_H_
#define PIPETRAIN_TESTS_RAW_STREAM_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain::testing {

// Writes `frames` in order on `method` (Exchange unless named), then
// closes its side unless told to stay open, reading what comes back unless
// told not to. Await() blocks the test thread until gRPC has run OnDone on
// its own (within `deadline_seconds`, the stream's deadline).
class RawStream
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawStream(const std::string& address, std::vector<grpc::ByteBuffer> frames,
            const std::string& method = "/pipetrain.v1.StageService/Exchange",
            bool close_after = true, bool read = true,
            double deadline_seconds = 20)
      : stub_(CreatePipetrainChannel(address)),
        frames_(std::move(frames)),
        close_after_(close_after) {
    ctx_.set_deadline(DeadlineIn(deadline_seconds));
    stub_.PrepareBidiStreamingCall(&ctx_, method, grpc::StubOptions(), this);
    if (read) StartRead(&in_);
    Next();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok) Next();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    absl::MutexLock lock(&mu_);
    status_ = s;
    done_ = true;
    cv_.SignalAll();
  }
  grpc::Status Await() {
    absl::MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    return status_;
  }

 private:
  void Next() {
    if (next_ < frames_.size()) {
      StartWrite(&frames_[next_++]);
    } else if (next_++ == frames_.size() && close_after_) {
      StartWritesDone();
    }
  }
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  std::vector<grpc::ByteBuffer> frames_;
  const bool close_after_;
  size_t next_ = 0;
  grpc::ByteBuffer in_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// `a`'s frames, then `b`'s.
inline std::vector<grpc::ByteBuffer> Join(
    std::vector<grpc::ByteBuffer> a, const std::vector<grpc::ByteBuffer>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_RAW_STREAM_H_
