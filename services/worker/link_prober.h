// LinkProber: measures this worker's links to other workers with Probe calls
// (StageService.Probe), over a channel built as the worker's stage stream to
// that peer is (CreatePipetrainChannel on the peer's address: the process's
// credentials, the address as the TLS target name), so the figures describe
// the path activations will take.
//
//   round-trip time: one warm-up call (connects), then the median of
//     `rtt_calls` empty calls;
//   bandwidth: one call carrying `first_payload_bytes`, not counted (it
//     opens TCP's window: on a 100 Mb/s link of 100 ms RTT its megabyte
//     measured 15 Mb/s, the next one's 92); then calls carrying a payload
//     that starts at `first_payload_bytes` and doubles until one call's
//     transfer (its time less the RTT) takes at least `target_transfer_seconds`
//     and `transfer_rtts` round trips, or the payload reaches
//     `max_payload_bytes`; then `bandwidth_calls` more calls at that size;
//     bandwidth = payload / (call time - RTT), the median over the calls at the
//     final size. A transfer of about one round trip measures the window more
//     than the link, so long links get long transfers, as the stage streams'
//     steady flow sees them. Total bytes and time are capped, so a slow link is
//     measured in a few seconds (100 Mb/s with 100 ms RTT: ~2.5 s) and a fast
//     one in tens of milliseconds.
//
// Every call has a deadline: a peer that is down gives an error within
// about `call_deadline_seconds`, never a hang.
#ifndef PIPETRAIN_SERVICES_WORKER_LINK_PROBER_H_
#define PIPETRAIN_SERVICES_WORKER_LINK_PROBER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.grpc.pb.h"

namespace pipetrain {

struct LinkProbeOptions {
  int rtt_calls = 5;
  int64_t first_payload_bytes = 1 << 20;
  int64_t max_payload_bytes = 16 << 20;  // kMaxProbeBytes
  double target_transfer_seconds = 0.1;
  double transfer_rtts = 3;
  int bandwidth_calls = 1;
  // Caps over the bandwidth phase.
  int64_t max_total_bytes = 96 << 20;
  double max_seconds = 6.0;
  double call_deadline_seconds = 2.0;
};

// Measures the link to the StageService at `target.address()` (this
// worker -> the target). Unavailable (or the call's error) naming the peer
// when it cannot be reached. Blocking; thread-safe.
absl::StatusOr<v1::LinkMeasurement> MeasureLink(
    const v1::ProbeTarget& target, const LinkProbeOptions& options = {});
// The same over a given stub (tests: in-process channels).
absl::StatusOr<v1::LinkMeasurement> MeasureLinkWith(
    v1::StageService::StubInterface& stub, const v1::ProbeTarget& target,
    const LinkProbeOptions& options);

// The cost of one message end (sending or receiving a message) through
// this process's own gRPC stack, from `options.rtt_calls` empty Probe calls
// to the StageService at `own_address` (this worker's server, dialled as a
// peer would dial it but without the network between). The call's error
// when the server cannot be reached under that name (e.g. a TLS
// certificate that does not name it).
struct MessageCost {
  // A quarter of the median round trip: the wait a stage sees per message
  // end (WorkerInfo.message_overhead_seconds).
  double seconds = 0;
  // A quarter of the process's CPU time per call, every thread counted
  // (gRPC's pollers, TLS; the median over batches of ten calls): what a
  // message end takes from the CPUs a machine's workers share
  // (WorkerInfo.message_cpu_seconds).
  double cpu_seconds = 0;
};
absl::StatusOr<MessageCost> MeasureMessageCost(
    const std::string& own_address, const LinkProbeOptions& options = {});

// Runs MeasureLink for queued targets on a thread of its own, so that the
// heartbeat that asked is never delayed; results wait in Take(). A target
// already queued is not queued twice. Failures are logged and dropped (the
// scheduler asks again later). Thread-safe; owns one thread.
class LinkProber {
 public:
  explicit LinkProber(LinkProbeOptions options = {});
  ~LinkProber();

  void Enqueue(const std::vector<v1::ProbeTarget>& targets);
  // Measurements finished since the last Take.
  std::vector<v1::LinkMeasurement> Take();
  // Puts back measurements a failed heartbeat did not deliver.
  void Return(std::vector<v1::LinkMeasurement> links);

 private:
  void Loop();

  const LinkProbeOptions options_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::ProbeTarget> queue_ ABSL_GUARDED_BY(mu_);
  std::string running_ ABSL_GUARDED_BY(mu_);  // worker id being measured
  std::vector<v1::LinkMeasurement> done_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_LINK_PROBER_H_
