// StagePort: a stage's connections to its neighbours: the links it sends on
// and the mailbox it receives from, with the stage's receive timeout.
//
// The first stage has no upstream, the last no downstream, except when
// interleaved: then the last stage's downstream and the first's upstream
// are the wrap-around link between them (a single stage links to itself).
// A link may be replaced at any time (a neighbour reconnects).
//
// Thread-safe: links are set from any thread while the training thread
// sends and receives.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_PORT_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_PORT_H_

#include <chrono>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/pipeline/mailbox.h"
#include "worker/pipeline/stage_metrics.h"

namespace pipetrain {

class StagePort {
 public:
  // `recv_timeout_s` <= 0 means the default (120 s). `metrics` (may be
  // null) is borrowed and must outlive the port.
  StagePort(double recv_timeout_s, StageMetrics* metrics);

  Mailbox* mailbox() { return &mailbox_; }

  void SetDownstream(std::shared_ptr<StageLink> link);
  void SetUpstream(std::shared_ptr<StageLink> link);
  // Drops the upstream link if it is still `link`.
  void ClearUpstream(const StageLink* link);
  // Sets the upstream link unless one is live: false (and no change) when
  // the stage already has one, so a second stream cannot displace it.
  bool SetUpstreamIfNone(std::shared_ptr<StageLink> link);
  bool has_downstream() const;

  // Queue a message on a link; Unavailable when there is none or it broke.
  // The time the call takes goes to the send_seconds metric.
  absl::Status SendDownstream(StageMessage message);
  absl::Status SendUpstream(StageMessage message);

  // Waits for message (kind, step, mb, chunk) until the receive timeout
  // (Unavailable) or a failure of the mailbox; adds the seconds waited to
  // *idle_seconds and to the idle metric.
  absl::StatusOr<StageMessage> Receive(MessageKind kind, int64_t step, int mb,
                                       int chunk, double* idle_seconds);
  // Waits up to `wait` for that message without taking it (true when it is
  // here or the mailbox failed), counting the seconds waited as Receive
  // does.
  bool WaitFor(MessageKind kind, int64_t step, int mb, int chunk,
               std::chrono::steady_clock::duration wait, double* idle_seconds);

 private:
  // Adds the seconds since `start` to *idle_seconds and the idle metric.
  void CountIdle(std::chrono::steady_clock::time_point start,
                 double* idle_seconds);
  absl::Status SendOn(const std::shared_ptr<StageLink>& link,
                      StageMessage message);

  // Constant after construction.
  const double recv_timeout_s_;
  StageMetrics* const metrics_;  // borrowed, may be null

  Mailbox mailbox_;  // thread-safe
  mutable absl::Mutex mu_;
  std::shared_ptr<StageLink> downstream_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<StageLink> upstream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_PORT_H_
