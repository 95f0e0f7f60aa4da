// Who may call a stage worker: its control calls (Configure, Train, Stop,
// snapshots, ...) come only from the scheduler's identity, and an Exchange
// stream only from the worker the scheduler configured as this stage's
// upstream (StageConfig.upstream_identity), and a link Probe or a
// ProbeExchange stream from any peer of the cluster (a certificate signed
// by its CA). Identities are certificate
// names, so the checks are on under mutual TLS and off on plaintext
// loopback (where every local process is trusted).
//
// A StageService method missing from the table in stage_access.cc is
// refused, so a new method is closed until its line is added.
#ifndef PIPETRAIN_SERVICES_WORKER_STAGE_ACCESS_H_
#define PIPETRAIN_SERVICES_WORKER_STAGE_ACCESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "services/rpc/transport_security.h"

namespace pipetrain {

inline constexpr char kDefaultSchedulerIdentity[] = "pipetrain-scheduler";

// Immutable; thread-safe.
class StageAccess {
 public:
  // Checks off (plaintext on loopback).
  StageAccess() = default;
  StageAccess(bool enforce, std::string scheduler_identity)
      : enforce_(enforce), scheduler_identity_(std::move(scheduler_identity)) {}

  bool enforced() const { return enforce_; }

  // PermissionDenied naming the peer when `peer` may not call `method`;
  // `upstream_identity` is the current stage's (for Exchange).
  absl::Status Check(const PeerIdentity& peer, absl::string_view method,
                     const std::string& upstream_identity) const;

 private:
  bool enforce_ = false;
  std::string scheduler_identity_ = kDefaultSchedulerIdentity;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_STAGE_ACCESS_H_
