#include "services/worker/stage_access.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain {
namespace {

// kClusterPeer: any caller whose certificate the cluster's CA signed (the
// scheduler, another worker); under mutual TLS that is every caller that
// got through the handshake, so the rule only refuses unauthenticated
// callers of a server that enforces.
enum class StageCaller { kScheduler, kUpstream, kClusterPeer };

// Every StageService method. Add one line per new method.
constexpr std::pair<absl::string_view, StageCaller> kStageMethods[] = {
    {"Configure", StageCaller::kScheduler},
    {"Train", StageCaller::kScheduler},
    {"Stop", StageCaller::kScheduler},
    {"GetStatus", StageCaller::kScheduler},
    {"GetWeights", StageCaller::kScheduler},
    {"Profile", StageCaller::kScheduler},
    {"GetTrace", StageCaller::kScheduler},
    {"Evaluate", StageCaller::kScheduler},
    {"Snapshot", StageCaller::kScheduler},
    {"FetchSnapshot", StageCaller::kScheduler},
    {"RestoreState", StageCaller::kScheduler},
    {"Exchange", StageCaller::kUpstream},
    // Link probes come from the workers the scheduler asked to measure
    // their links to this one: it names no caller in advance.
    {"Probe", StageCaller::kClusterPeer},
    // The same on the stage stream's path: a probe stream holds no stage.
    {"ProbeExchange", StageCaller::kClusterPeer},
};

}  // namespace

absl::Status StageAccess::Check(const PeerIdentity& peer,
                                absl::string_view method,
                                const std::string& upstream_identity) const {
  const StageCaller* caller = nullptr;
  for (const auto& [name, who] : kStageMethods) {
    if (name == method) caller = &who;
  }
  if (caller == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("stage method ", method, " has no access rule"));
  }
  if (!enforce_) return absl::OkStatus();
  if (*caller == StageCaller::kClusterPeer) {
    if (peer.authenticated) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(method, " refused for ", peer.address,
                     ": only a peer of this cluster (a certificate from its "
                     "CA) may call it"));
  }
  const std::string& expected = *caller == StageCaller::kScheduler
                                    ? scheduler_identity_
                                    : upstream_identity;
  if (peer.authenticated && peer.Has(expected)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      method, " refused for ", peer.address, " (",
      absl::StrJoin(peer.names, ","), "): only ",
      *caller == StageCaller::kScheduler ? "the scheduler" : "the upstream",
      expected.empty() ? " (none configured)" : absl::StrCat(" ", expected),
      " may call it"));
}

}  // namespace pipetrain
