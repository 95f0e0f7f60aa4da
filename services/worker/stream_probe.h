// The cost of a stage message on the stage stream's own path: a worker
// opens a ProbeExchange stream to its own server (FrameHeader.echo,
// UpstreamStream's probe streams: the Exchange stream's code, echoing) and
// sends activations one at a time, each from a thread that then waits in a
// mailbox for its echo, as a stage's executor sends a message and waits for
// the next: small ones, then ones as large as an echo may be, for what a
// byte of payload adds.
//
// A message so goes the way a stage's does: encoded on the sending thread,
// written by gRPC (its callback threads finish the write and read the
// other side), decoded, delivered to a mailbox, and the waiting thread
// woken, on both ends. Empty unary Probe calls (MeasureMessageCost) skip
// most of that: on a 2-core virtual machine a stage-stream message end cost
// about three times the CPU the unary calls measured.
//
// The messages are spaced by idle gaps, as a pipeline's are (a stage that
// waits for its neighbour goes idle, and so do gRPC's threads): a message
// that wakes sleeping threads costs more than one in a tight loop.
#ifndef PIPETRAIN_SERVICES_WORKER_STREAM_PROBE_H_
#define PIPETRAIN_SERVICES_WORKER_STREAM_PROBE_H_

#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

struct StreamProbeOptions {
  // Messages whose round trips are timed, after `warmup` that are not.
  int messages = 60;
  int warmup = 5;
  // Floats of each message's activation.
  int floats = 64;
  // Then `large_messages` timed (after `warmup`) of this many floats, for
  // the CPU a byte of payload adds (StreamMessageCost::cpu_seconds_per_byte),
  // above `floats` and at most the echo limit
  // (UpstreamStream::kMaxEchoBytes / 4). 0: not measured. Fewer than the
  // small ones: a worker's start waits for them.
  int large_floats = 16384;
  int large_messages = 30;
  // Idle time before each message, and after each batch of ten.
  double gap_seconds = 0.002;
  double batch_gap_seconds = 0.03;
  // Each echo must come back within this.
  double deadline_seconds = 2.0;
};

struct StreamMessageCost {
  // One message's way, from the sending thread's Send to the receiving
  // thread's wake-up with it decoded: half the median round trip
  // (WorkerInfo.stream_hop_seconds).
  double hop_seconds = 0;
  // This process's CPU (every thread) per message end: a round trip is
  // four (each message sent and received, both ends in this process); the
  // median over batches of ten round trips, each batch followed by
  // `batch_gap_seconds` of idle time (WorkerInfo.message_cpu_seconds).
  double cpu_seconds = 0;
  // The CPU per message end that each byte of payload adds: the large
  // messages' CPU per end less the small ones', over the difference in
  // their payloads, at least 0; 0 when not measured
  // (WorkerInfo.message_cpu_seconds_per_byte).
  double cpu_seconds_per_byte = 0;
};

// Measures on the StageService at `own_address` (this worker's own server,
// dialled as a peer dials it). The stream's error when the server cannot
// be reached, refuses the probe (another runs), or an echo does not come
// back within the deadline. Blocking.
absl::StatusOr<StreamMessageCost> MeasureStreamMessageCost(
    const std::string& own_address, const StreamProbeOptions& options = {});

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_STREAM_PROBE_H_
