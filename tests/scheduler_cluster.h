// The fixture of the scheduler end-to-end tests: a scheduler process with
// its SQLite state in a fresh directory and three worker processes on
// loopback (zones z0, z1, z0), plus the calls the tests make through the
// scheduler's gRPC API and the in-process reference they compare with.
#ifndef PIPETRAIN_TESTS_SCHEDULER_CLUSTER_H_
#define PIPETRAIN_TESTS_SCHEDULER_CLUSTER_H_

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "tests/cluster_harness.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain::testing {

// The lease and heartbeat every scheduler of these tests runs with.
std::vector<std::string> SchedulerFlags();

// Planning inputs pinned, for tests of what the scheduler does around a
// plan (growth, recovery) rather than of the plan itself. Every worker
// tells the planner the same GEMM speed: measured on a busy machine the
// speeds differ by up to ten times from one start to the next, and the
// growth decision (a third stage, or a move onto "faster" spares) would
// follow that noise. For the same reason the links are pinned: the measured
// loopback round trips (0.1 to 2 ms on a busy machine) and the per-message
// overhead taken from them would decide whether a third stage pays off.
inline constexpr char kPinnedSpeed[] = "--gemm_gflops=50";
// And the machine: the workers stand for machines of their own, not three
// processes on one machine's CPUs (whose floor, from each worker's measured
// CPU per message, would decide the same).
inline constexpr char kOwnMachine[] = "--host_id=-";
std::vector<std::string> PinnedLinkFlags();

// examples/<name> with `steps` steps (and no epoch count).
v1::TrainingSpec LoadSpec(const std::string& name, int64_t steps);
// The Fashion-MNIST MLP example.
v1::TrainingSpec MlpSpec(int64_t steps);

std::string ToJsonString(const google::protobuf::Message& m);

// The in-process trainer's run of `spec` for `steps` steps (spec.steps()
// when negative), then its evaluation on `eval_samples` held-out samples
// (0: all).
struct ReferenceRun {
  std::vector<double> losses;
  EvalReport eval;
};
ReferenceRun TrainInProcess(const v1::TrainingSpec& spec, int64_t steps = -1,
                            int64_t eval_samples = 0);

// The in-process trainer's parameters after `spec.steps()` steps, in model
// (layer) order: the fault-free run recovered jobs are compared with.
std::vector<std::vector<float>> ReferenceWeights(const v1::TrainingSpec& spec);

// Fails the test (once, naming `what` and the first parameter that
// differs) unless `got` equals `want` within `abs` (absolute).
void ExpectWeightsNear(const std::vector<std::vector<float>>& got,
                       const std::vector<std::vector<float>>& want, double abs,
                       const std::string& what);

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override;

  v1::ListWorkersResponse ListWorkers();
  // Waits until at least `n` workers are in `state`.
  bool WaitForWorkers(int n, v1::WorkerState state, double timeout_s = 20);
  v1::Job GetJob(const std::string& id);
  // Waits for `want` (or FAILED) and returns the job as last seen.
  v1::Job WaitForState(const std::string& id, v1::JobState want,
                       double timeout_s = 120);
  // Waits until the job has completed `step` steps; false on timeout or
  // when it left RUNNING.
  bool WaitForStep(const std::string& id, int64_t step, double timeout_s = 60);
  // Submits over gRPC; fails the test when the call fails.
  v1::Job Submit(const v1::JobSpec& spec);
  v1::Plan GetPlan(const std::string& id);
  // The worker process at `address` (a plan's worker_address), or null.
  Worker* WorkerAt(const std::string& address);
  // Starts one more worker (in `zone`) registered with the scheduler; it
  // becomes IDLE (a spare) unless a job takes it.
  void AddWorker(const std::string& zone = "z1");
  // Every stage's parameters of `job` in model (layer) order, from the
  // workers its current plan names.
  std::vector<std::vector<float>> JobWeights(const std::string& job);
  // Committed checkpoints of `job`; waits up to `timeout_s` for at least
  // `at_least`.
  v1::ListCheckpointsResponse WaitForCheckpoint(const std::string& job,
                                                double timeout_s,
                                                int at_least = 1);
  // SIGKILLs the scheduler (when it runs) and starts a new one on the same
  // data directory and gRPC port, where its workers find it again.
  void RestartScheduler();

  // Flags the scheduler starts with besides SchedulerFlags(); a derived
  // fixture sets them in its constructor.
  std::vector<std::string> extra_scheduler_flags_;
  // Flags every worker started by SetUp or AddWorker gets besides its
  // scheduler and zone.
  std::vector<std::string> extra_worker_flags_;
  TempDir dir_;
  Scheduler scheduler_;
  std::vector<Worker> workers_;
};

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_SCHEDULER_CLUSTER_H_
