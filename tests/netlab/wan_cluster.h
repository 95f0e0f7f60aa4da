// WAN scenarios for the network lab and a scheduler with its workers run
// in them (or on loopback, the baseline), used by wan_e2e_test and
// bench_wan.
//
// Delays are one-way, applied in each direction of a link (as netem's
// delay on both ends): "20 ms" between two hosts is a 40 ms round trip.
//
// Hosts: "sched" (the scheduler), "w0", "w1", ... (one worker each); the
// test or benchmark is the lab's controller host, reaching the scheduler
// over the scenario's default link.
#ifndef PIPETRAIN_TESTS_NETLAB_WAN_CLUSTER_H_
#define PIPETRAIN_TESTS_NETLAB_WAN_CLUSTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.grpc.pb.h"
#include "tests/cluster_harness.h"
#include "tests/netlab/netlab.h"

namespace pipetrain::netlab {

struct Scenario {
  std::string name;
  std::string description;
  LabOptions lab;
  // Worker host -> share of one core (cgroup CPU quota); absent: no cap.
  std::map<std::string, double> cpu_share;
  // The configured round trip between w0 and w1 (the pipeline's link when
  // two workers run it), seconds, and that link's rate, bits/s (0:
  // unlimited).
  double configured_rtt_s = 0;
  double configured_rate_bits_per_s = 0;
};

// datacenter, two_regions, edge, mixed_speeds.
std::vector<std::string> ScenarioNames();
// The scenario for `workers` workers (2 or 3).
absl::StatusOr<Scenario> MakeScenario(const std::string& name, int workers);

// What a job run produced.
struct JobRun {
  // SubmitJob's answer: not OK when the scheduler refused the spec.
  absl::Status submitted;
  v1::Job job;  // as last seen
  v1::Plan plan;
  bool completed = false;
  double wall_seconds = 0;  // submit to COMPLETED (or to giving up)
  // The stages' own step time: batch size / Job.samples_per_second (the
  // mean of the last stage's recent steps).
  double step_seconds = 0;
  // In a lab: the bytes the emulator delivered between worker hosts from
  // the job's first RUNNING state seen (polled every 100 ms; the planning
  // probes before it are not the job's) to its end: the pipeline's links,
  // every header included; -1 on loopback.
  int64_t worker_link_bytes = -1;
};

// A scheduler and its workers, on loopback or in a scenario's lab. Not
// thread-safe.
class JobCluster {
 public:
  static absl::StatusOr<std::unique_ptr<JobCluster>> OnLoopback(int workers);
  static absl::StatusOr<std::unique_ptr<JobCluster>> InScenario(
      const Scenario& scenario, int workers);
  ~JobCluster();

  // Submits `spec`, waits until it completes or fails or `timeout_s`
  // passes.
  JobRun Run(const v1::JobSpec& spec, double timeout_s);

  // The workers as the scheduler lists them.
  v1::ListWorkersResponse Workers();

  // The lab (null on loopback).
  NetLab* lab() { return lab_.get(); }

  // Median TCP round trip between hosts `from` and `to` as the emulator
  // produces it (pipetrain-link-probe), seconds.
  absl::StatusOr<double> MeasureRtt(const std::string& from,
                                    const std::string& to);

 private:
  JobCluster() = default;
  absl::Status WaitForIdleWorkers(int n, double timeout_s);
  // Bytes delivered between worker hosts so far; -1 on loopback.
  int64_t WorkerLinkBytes();

  // Destroyed last: the processes in it go first.
  std::unique_ptr<NetLab> lab_;
  testing::TempDir dir_;
  std::unique_ptr<testing::ChildProcess> scheduler_process_;
  std::unique_ptr<v1::SchedulerService::Stub> scheduler_;
  std::vector<std::unique_ptr<testing::ChildProcess>> workers_;
  std::vector<std::unique_ptr<testing::ChildProcess>> probes_;
};

// The pipetrain-link-probe binary.
std::string ProbeBinary();

// Bytes one sample sends across every cut of `plan`, activations down and
// gradients back up, in `spec`'s wire format (spec/wire_size.h).
int64_t WireBytesPerSample(const v1::JobSpec& spec, const v1::Plan& plan);

}  // namespace pipetrain::netlab

#endif  // PIPETRAIN_TESTS_NETLAB_WAN_CLUSTER_H_
