// WorkerRegistry: the workers the scheduler knows, their leases and states.
//
// Workers register (REGISTERED), heartbeat (IDLE or ASSIGNED), and turn LOST
// when a lease passes without a heartbeat. A LOST worker that heartbeats
// again comes back IDLE. Registrations and state changes are persisted, so
// a restarted scheduler lists the workers it had; they keep their ids and
// get a fresh lease to come back in. Persistence is queued on a
// StateWriter (no I/O under the registry's lock, which heartbeats take).
//
// It also keeps the link matrix: each worker's measured links to the others
// (WorkerInfo.links, one LinkMeasurement per peer, source "probe"), and
// decides which links a worker should measure next (ProbesFor): a pair
// never measured or measured more than link_refresh_seconds ago, while
// neither end runs a stage (probes would disturb it), or any pair a planner
// asked for (WantProbes) even then. A pair asked for is not asked again for
// probe_retry_seconds (a peer that is down must not be probed every beat).
// Measurements never share a worker: while a pair is being measured
// (asked, not yet reported, within the retry period) neither end is asked
// to measure or be measured by another, so one probe's traffic does not
// slow another's.
//
// Thread-safe.
#ifndef PIPETRAIN_SCHEDULER_WORKER_REGISTRY_H_
#define PIPETRAIN_SCHEDULER_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "scheduler/state_writer.h"

namespace pipetrain {

// Who is registering, as the network edge established it.
struct WorkerAdmission {
  // The caller's identity (certificate name under TLS, else its host).
  std::string identity;
  // True when `identity` was proven by a certificate.
  bool identity_verified = false;
  // RegisterWorkerRequest.worker_secret.
  std::string presented_secret;
  // Bound to the id and returned in the response (empty: none, as in
  // tests that drive the core directly).
  std::string new_secret;
};

struct RegistryOptions {
  double lease_seconds = 3.0;
  double heartbeat_interval_seconds = 0.5;
  // A LOST worker is forgotten this long after its last heartbeat (0:
  // kept until removed).
  double lost_expiry_seconds = 0;
  // A link measured longer ago than this is measured again.
  double link_refresh_seconds = 600;
  // A probe asked for and not reported is asked for again after this.
  double probe_retry_seconds = 10;
};

class WorkerRegistry {
 public:
  // `writer` (borrowed, may be null) persists registrations.
  WorkerRegistry(const RegistryOptions& options, StateWriter* writer);

  // Adds workers a previous scheduler persisted; each gets a fresh lease
  // from `now_ms`.
  void Load(std::vector<v1::WorkerInfo> workers, int64_t now_ms);

  // InvalidArgument when the address is missing. An empty id gets a fresh
  // one. A known id (a restarted worker) is updated in place, but only for
  // the identity that registered it, presenting its secret (or proven by
  // certificate); PermissionDenied otherwise. Binds the id to
  // `admission.identity` and `admission.new_secret`.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      v1::WorkerInfo info, int64_t now_ms,
      const WorkerAdmission& admission = {});
  // Whether a heartbeat for `id` comes from the worker that registered it:
  // OK when `identity` and `secret` match its binding; NotFound for an
  // unknown id; PermissionDenied otherwise. A worker restored from disk has
  // no secret (secrets live in memory only): its registered identity
  // decides, and the first heartbeat's secret becomes its binding.
  absl::Status CheckCaller(const std::string& id, const std::string& identity,
                           const std::string& secret);
  // Renews the lease; false when the id is unknown.
  bool Heartbeat(const std::string& id, int64_t now_ms);
  // Marks workers whose lease ran out LOST (returns their ids) and forgets
  // LOST ones past lost_expiry_seconds.
  std::vector<std::string> Sweep(int64_t now_ms);
  // Forgets a worker that left for good: NotFound for an unknown id,
  // FailedPrecondition while it is ASSIGNED (it runs a stage).
  absl::Status Remove(const std::string& id);

  std::vector<v1::WorkerInfo> List() const;
  std::optional<v1::WorkerInfo> Get(const std::string& id) const;
  // Idle workers whose labels include every pair of `selector`, in
  // registration order.
  std::vector<v1::WorkerInfo> Idle(
      const google::protobuf::Map<std::string, std::string>& selector) const;
  // Workers not LOST.
  int CountAlive() const;

  // Marks `id` ASSIGNED to stage `stage` of `job_id`.
  absl::Status Assign(const std::string& id, const std::string& job_id,
                      int stage);
  // Assigns the whole of job `job_id` at once: each (worker, stage) of
  // `stages` must be IDLE or already assigned to the job (FailedPrecondition
  // naming the first that is not, nothing changed); every other worker of
  // the job is released. Atomic, so that a recovery never lets another job
  // take a worker it keeps.
  absl::Status AssignJob(
      const std::string& job_id,
      const std::vector<std::pair<std::string, int>>& stages);
  // Every worker assigned to `job_id` (and not LOST) becomes IDLE.
  void Release(const std::string& job_id);
  // Workers assigned to `job_id`, LOST ones included.
  std::vector<v1::WorkerInfo> AssignedTo(const std::string& job_id) const;

  // Links: stores what worker `id` measured (one entry per peer, the newest
  // wins; measured_unix_ms becomes `now_ms`, the scheduler's clock that
  // staleness is judged by). Measurements to unknown workers are dropped.
  void RecordLinks(
      const std::string& id,
      const google::protobuf::RepeatedPtrField<v1::LinkMeasurement>& links,
      int64_t now_ms);
  // The peers worker `id` should measure now (see the class comment); marks
  // them asked.
  std::vector<v1::ProbeTarget> ProbesFor(const std::string& id, int64_t now_ms);
  // Asks for every missing or stale directed link among `ids` at the next
  // heartbeats, whatever the workers run; returns how many there are.
  int WantProbes(const std::vector<std::string>& ids, int64_t now_ms);
  // Directed links among `ids` that are missing or stale.
  int MissingLinks(const std::vector<std::string>& ids, int64_t now_ms) const;

  const RegistryOptions& options() const { return options_; }

 private:
  void Persist(const v1::WorkerInfo& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether worker `from`'s link to `to` is missing or older than the
  // refresh period.
  bool LinkDue(const v1::WorkerInfo& from, const std::string& to,
               int64_t now_ms) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The directed links (from, to) among registered `ids` that are due.
  std::vector<std::pair<std::string, std::string>> DueLinks(
      const std::vector<std::string>& ids, int64_t now_ms) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  StateWriter* const writer_;  // borrowed, may be null

  mutable absl::Mutex mu_;
  std::map<std::string, v1::WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Id -> the secret its registration returned; only in memory, so
  // workers restored from disk have none until they register again.
  std::map<std::string, std::string> secrets_ ABSL_GUARDED_BY(mu_);
  // Directed pairs (from, to): when last asked to measure; asked for by a
  // planner.
  std::map<std::pair<std::string, std::string>, int64_t> probe_asked_ms_
      ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> probe_wanted_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_WORKER_REGISTRY_H_
