// The cost model's links: per worker pair (measured, then the zone
// overrides and defaults), bytes as encoded on the wire (int8 vs f32),
// latency per message in the simulated step, the per-message overhead, and
// cuts placed where activations are small when a link is slow. Every test
// is a pure function of its request.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/plan_builder.h"
#include "scheduler/planner.h"
#include "scheduler/planner_test_util.h"
#include "scheduler/step_prediction.h"
#include "spec/wire_size.h"

namespace pipetrain {
namespace {

using planner_testing::Layer;
using planner_testing::Stage;
using planner_testing::Worker;

TEST(LinkBetweenTest, MeasuredThenReverseThenOverridesThenDefaults) {
  PlanRequest request;
  request.workers = {Worker("w0", 1, 0, "a"), Worker("w1", 1, 0, "a"),
                     Worker("w2", 1, 0, "b")};
  request.topology.intra_zone_bandwidth = 5e9;
  request.topology.default_bandwidth = 1e9;
  request.links[{"w0", "w1"}] = {2e8, 0.002, "probe"};
  const auto& w = request.workers;
  LinkEstimate l = LinkBetween(request, w[0], w[1]);
  EXPECT_EQ(l.bandwidth_bytes_per_s, 2e8);
  EXPECT_EQ(l.rtt_seconds, 0.002);
  EXPECT_EQ(l.source, "probe");
  // The other direction was not measured: the reverse stands in.
  EXPECT_EQ(LinkBetween(request, w[1], w[0]).bandwidth_bytes_per_s, 2e8);
  // Nothing measured: the zone default, no latency.
  l = LinkBetween(request, w[0], w[2]);
  EXPECT_EQ(l.bandwidth_bytes_per_s, 1e9);
  EXPECT_EQ(l.rtt_seconds, 0.0);
  EXPECT_EQ(l.source, "default");
  // An override of the zone pair wins over the measurement.
  request.topology.bandwidth[{"a", "a"}] = 7e9;
  request.topology.rtt[{"a", "a"}] = 0.01;
  l = LinkBetween(request, w[0], w[1]);
  EXPECT_EQ(l.bandwidth_bytes_per_s, 7e9);
  EXPECT_EQ(l.rtt_seconds, 0.01);
  EXPECT_EQ(l.source, "override");
}

TEST(LinkCostTest, EachPairUsesItsOwnMeasuredLink) {
  // Three alike workers in one zone; w0 -> w1 is slow, w0 -> w2 fast. The
  // planner puts stage 1 on w2.
  PlanRequest request;
  request.layers = {Layer(0.01, 0.02, 10'000'000, 0),
                    Layer(0.01, 0.02, 1000, 0)};
  request.workers = {Worker("w0", 1, 0, "z"), Worker("w1", 1, 0, "z"),
                     Worker("w2", 1, 0, "z")};
  request.links[{"w0", "w1"}] = {1e6, 0.001, "probe"};
  request.links[{"w0", "w2"}] = {1e10, 0.001, "probe"};
  request.links[{"w1", "w2"}] = {1e6, 0.001, "probe"};
  request.num_stages = 2;
  request.micro_batches = 4;
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].worker, 0) << plan->explanation;
  EXPECT_EQ(plan->stages[1].worker, 2) << plan->explanation;
  EXPECT_DOUBLE_EQ(plan->stages[0].transfer_seconds, 10'000'000 / 1e10);
  EXPECT_DOUBLE_EQ(plan->stages[0].latency_seconds, 0.0005);
}

// A two-layer MLP whose cut activation is [16, 512]: micro-batches of 16.
v1::JobSpec MlpSpec() {
  v1::JobSpec spec;
  const absl::Status parsed = ParseJson(R"({
    "training": {
      "model": {
        "inputKind": "INPUT_KIND_FLOAT", "inputShape": [64],
        "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
        "layers": [
          {"linear": {"inFeatures": 64, "outFeatures": 512}},
          {"linear": {"inFeatures": 512, "outFeatures": 10}}
        ]},
      "batchSize": 64, "microBatches": 4}})",
                                        &spec);
  EXPECT_TRUE(parsed.ok()) << parsed;
  return spec;
}

TEST(WireBytesTest, Int8ShrinksTheTransferByTheWireFormatsFactor) {
  v1::JobSpec f32 = MlpSpec();
  v1::JobSpec int8 = f32;
  int8.mutable_wire_compression()->set_activations(v1::WIRE_QUANTIZATION_INT8);
  int8.mutable_wire_compression()->set_gradients(v1::WIRE_QUANTIZATION_INT8);
  const std::vector<LayerWireBytes> plain = WireBytesPerLayer(f32);
  const std::vector<LayerWireBytes> packed = WireBytesPerLayer(int8);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(packed.size(), 2u);
  // f32: 16 rows of 512 floats. int8: per row 512 codes plus 4 groups of
  // 128 with 8 bytes of scale and offset each.
  EXPECT_EQ(plain[0].activation, 16 * 512 * 4);
  EXPECT_EQ(packed[0].activation, 16 * (512 + 4 * kWireGroupHeaderBytes));
  EXPECT_EQ(packed[0].gradient, packed[0].activation);

  // The cost model charges the link with exactly those bytes.
  auto transfer = [](const LayerWireBytes& bytes) {
    PlanRequest request;
    LayerCost first = Layer(0.001, 0.002, 16 * 512 * 4, 0);
    first.activation_wire_bytes = bytes.activation;
    first.gradient_wire_bytes = bytes.gradient;
    request.layers = {first, Layer(0.001, 0.002, 640, 0)};
    request.workers = {Worker("w0", 1, 0, "a"), Worker("w1", 1, 0, "b")};
    request.topology.default_bandwidth = 1e7;
    absl::StatusOr<PipelinePlan> plan =
        EvaluatePlacement(request, {Stage(0, 1, 0), Stage(1, 2, 1)});
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan->stages[0].transfer_seconds;
  };
  const double factor = static_cast<double>(packed[0].activation) /
                        static_cast<double>(plain[0].activation);
  EXPECT_NEAR(factor, (512 + 32) / 2048.0, 1e-15);
  EXPECT_NEAR(transfer(packed[0]), factor * transfer(plain[0]), 1e-15);
}

PlanInputs TwoWorkerInputs(double rtt) {
  PlanInputs in;
  in.job_id = "job-1";
  in.spec = MlpSpec();
  in.spec.set_num_stages(2);
  in.message_overhead_seconds = 0;  // latency alone
  for (int l = 0; l < 2; ++l) {
    v1::LayerProfile* layer = in.profile.add_layers();
    layer->set_forward_seconds(0.001);
    layer->set_backward_seconds(0.002);
    layer->set_activation_bytes(l == 0 ? 16 * 512 * 4 : 640);
  }
  for (int w = 0; w < 2; ++w) {
    v1::WorkerInfo info;
    info.set_id("w-" + std::to_string(w));
    info.set_gemm_gflops(10);
    v1::LinkMeasurement* link = info.add_links();
    link->set_to_worker_id("w-" + std::to_string(1 - w));
    link->set_bandwidth_bytes_per_s(1e12);
    link->set_rtt_seconds(rtt);
    link->set_source("probe");
    in.workers.push_back(info);
  }
  return in;
}

TEST(SimulatedStepTest, FillAndDrainPayEachLinksLatencyOncePerWay) {
  absl::StatusOr<v1::Plan> fast = BuildPlan(TwoWorkerInputs(0.0));
  absl::StatusOr<v1::Plan> slow = BuildPlan(TwoWorkerInputs(0.010));
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->stages(0).link_rtt_seconds(), 0.010);
  EXPECT_EQ(slow->stages(0).wire_bytes_per_micro_batch(), 2 * 16 * 512 * 4);
  // GPipe, K = 2: the first activation waits RTT / 2 on the way down and
  // the last gradient RTT / 2 on the way up; the rest overlaps compute.
  EXPECT_NEAR(slow->predicted_step_seconds() - fast->predicted_step_seconds(),
              0.010, 1e-9);
  // 1F1B-flush: each micro-batch's gradient needs the round trip, which the
  // steady state cannot hide behind one micro-batch of work.
  PlanInputs one_f_one_b = TwoWorkerInputs(0.010);
  one_f_one_b.spec.set_schedule(v1::SCHEDULE_1F1B_FLUSH);
  absl::StatusOr<v1::Plan> flush = BuildPlan(one_f_one_b);
  ASSERT_TRUE(flush.ok()) << flush.status();
  EXPECT_GT(flush->predicted_step_seconds(),
            slow->predicted_step_seconds() - 1e-9);
}

// A stage that holds its weight-gradient products back (micro-batches of
// fewer than kMaxHeldWeightGradRows rows) runs them at its optimizer step,
// so ZB-H1's deferred W passes fill no bubble: it is predicted as fast as
// 1F1B-flush, not faster. Micro-batches of 256 rows are not held, and the
// W passes fill the bubble.
TEST(SimulatedStepTest, HeldWeightGradientsLeaveZbH1NoBubbleToFill) {
  auto predict = [](v1::ScheduleKindProto kind, int64_t batch) {
    PlanInputs in = TwoWorkerInputs(0.0);
    in.spec.set_schedule(kind);
    in.spec.mutable_training()->set_batch_size(batch);
    absl::StatusOr<v1::Plan> plan = BuildPlan(in);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->predicted_step_seconds() : -1.0;
  };
  // 16 rows a micro-batch: held.
  EXPECT_NEAR(predict(v1::SCHEDULE_ZB_H1, 64),
              predict(v1::SCHEDULE_1F1B_FLUSH, 64), 1e-12);
  // 256 rows: not held.
  EXPECT_LT(predict(v1::SCHEDULE_ZB_H1, 1024),
            predict(v1::SCHEDULE_1F1B_FLUSH, 1024) - 1e-4);
}

TEST(SimulatedStepTest, MessageOverheadIsStageTimePerMessage) {
  PlanInputs plain = TwoWorkerInputs(0.0);
  PlanInputs overhead = plain;
  overhead.message_overhead_seconds = 0.0005;
  absl::StatusOr<v1::Plan> a = BuildPlan(plain);
  absl::StatusOr<v1::Plan> b = BuildPlan(overhead);
  ASSERT_TRUE(a.ok() && b.ok());
  // Each stage has one neighbour: it sends and receives one message per
  // micro-batch each way.
  EXPECT_NEAR(b->stages(0).compute_seconds() - a->stages(0).compute_seconds(),
              2 * 0.0005, 1e-12);
  EXPECT_GT(b->predicted_step_seconds(), a->predicted_step_seconds());
}

// Workers that measured their own stack (WorkerInfo.message_overhead_
// seconds) give the overhead: the median over them, whatever the links'
// round trips, which across a WAN are the network's (here 40 ms).
TEST(SimulatedStepTest, WorkersOwnMeasurementWinsOverLinkRoundTrips) {
  std::vector<v1::WorkerInfo> workers(3);
  for (v1::WorkerInfo& w : workers) {
    v1::LinkMeasurement* l = w.add_links();
    l->set_rtt_seconds(0.040);
    l->set_source("probe");
  }
  workers[0].set_message_overhead_seconds(0.00003);
  workers[1].set_message_overhead_seconds(0.00005);
  EXPECT_DOUBLE_EQ(MessageOverhead(-1, workers), 0.00004);
  workers[2].set_message_overhead_seconds(0.00002);
  EXPECT_DOUBLE_EQ(MessageOverhead(-1, workers), 0.00003);
  EXPECT_EQ(MessageOverhead(0.002, workers), 0.002);  // the flag still wins
  // The plan's explanation names where the figure came from.
  EXPECT_THAT(MessageOverheadSource(-1, workers),
              ::testing::HasSubstr("own gRPC stacks"));
  EXPECT_EQ(MessageOverheadSource(0.002, workers),
            "--message_overhead_seconds");
  for (v1::WorkerInfo& w : workers) w.clear_message_overhead_seconds();
  EXPECT_THAT(MessageOverheadSource(-1, workers),
              ::testing::HasSubstr("probe RTT"));
}

// The stream's extra latency: each worker's hop less the four overheads a
// plan already charges a message, at least 0; the median over the workers
// that measured both; none when the flag sets the message costs.
TEST(SimulatedStepTest, StreamExtraIsTheHopBeyondWhatThePlanChargesAMessage) {
  std::vector<v1::WorkerInfo> workers(4);
  EXPECT_EQ(StreamExtraLatency(-1, workers), 0.0);
  workers[0].set_stream_hop_seconds(0.0002);
  workers[0].set_message_overhead_seconds(0.00002);  // 0.00012 more
  workers[1].set_stream_hop_seconds(0.0003);
  workers[1].set_message_overhead_seconds(0.00005);  // 0.0001 more
  workers[2].set_stream_hop_seconds(0.00005);
  workers[2].set_message_overhead_seconds(0.00002);  // below: 0
  workers[3].set_stream_hop_seconds(0.5);            // no overhead: left out
  EXPECT_NEAR(StreamExtraLatency(-1, workers), 0.0001, 1e-15);
  EXPECT_EQ(StreamExtraLatency(0.00001, workers), 0.0);
}

// GPipe, K = 2: the extra latency is paid by the first activation on its
// way down and the last gradient on its way up, as a link's latency is.
TEST(SimulatedStepTest, StreamExtraIsPaidOncePerWayInFillAndDrain) {
  auto plan_with = [](double hop) {
    PlanInputs in = TwoWorkerInputs(0.0);
    in.message_overhead_seconds = -1;  // measured
    for (v1::WorkerInfo& w : in.workers) {
      w.set_message_overhead_seconds(1e-6);
      w.set_stream_hop_seconds(hop);
    }
    absl::StatusOr<v1::Plan> plan = BuildPlan(in);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::Plan();
  };
  const v1::Plan slow = plan_with(0.004 + 4e-6);
  const v1::Plan fast = plan_with(4e-6);
  EXPECT_NEAR(slow.predicted_step_seconds() - fast.predicted_step_seconds(),
              2 * 0.004, 1e-9);
  // The plan says what it added, and what the simulation gave.
  EXPECT_THAT(slow.explanation(),
              ::testing::HasSubstr("stage stream: 4.000 ms more a message"));
  EXPECT_THAT(slow.explanation(), ::testing::HasSubstr(absl::StrFormat(
                                      "message costs: a step of %.3f ms",
                                      slow.predicted_step_seconds() * 1e3)));
  EXPECT_THAT(fast.explanation(),
              ::testing::Not(::testing::HasSubstr("stage stream:")));
}

// The CPU per message end: the median of what the workers measured, else
// the overhead figure (a message end takes at least the wait it causes).
TEST(SharedCpuStepTest, MessageCpuIsTheWorkersMedianElseTheOverhead) {
  std::vector<v1::WorkerInfo> workers(3);
  EXPECT_EQ(MessageCpu(0.00002, workers), 0.00002);
  workers[0].set_message_cpu_seconds(0.00006);
  workers[2].set_message_cpu_seconds(0.00004);
  EXPECT_DOUBLE_EQ(MessageCpu(0.00002, workers), 0.00005);
  workers[1].set_message_cpu_seconds(0.00003);
  EXPECT_DOUBLE_EQ(MessageCpu(0.00002, workers), 0.00004);
}

TEST(SimulatedStepTest, MeasuredOverheadIsAQuarterOfTheMedianProbeRtt) {
  std::vector<v1::WorkerInfo> workers(2);
  for (double rtt : {0.0004, 0.0002, 0.0010}) {
    v1::LinkMeasurement* l = workers[0].add_links();
    l->set_rtt_seconds(rtt);
    l->set_source("probe");
  }
  v1::LinkMeasurement* fixed = workers[1].add_links();
  fixed->set_rtt_seconds(0.5);
  fixed->set_source("override");  // not a measurement of the stack
  EXPECT_DOUBLE_EQ(MessageOverhead(-1, workers), 0.0004 / 4);
  EXPECT_EQ(MessageOverhead(0.002, workers), 0.002);
  EXPECT_EQ(MessageOverhead(-1, {}), 0.0);
  // A plan with probed links charges it unless the flag fixes it.
  PlanInputs measured = TwoWorkerInputs(0.004);
  measured.message_overhead_seconds = -1;
  absl::StatusOr<v1::Plan> plan = BuildPlan(measured);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->stages(0).compute_seconds(), 0.003 + 2 * 0.001, 1e-12);
  EXPECT_NE(plan->explanation().find("message overhead 1.000 ms"),
            std::string::npos)
      << plan->explanation();
}

// Three stages of one layer each (forward 1 ms, backward 2 ms, update
// 0.5 ms), M = 4, 0.1 ms of CPU per message end.
PlanRequest SharedMachineRequest() {
  PlanRequest request;
  for (int l = 0; l < 3; ++l) {
    LayerCost layer = Layer(0.001, 0.002, 1024, 4096);
    layer.optimizer_seconds = 0.0005;
    request.layers.push_back(layer);
  }
  request.workers = {Worker("w0", 1, 0, ""), Worker("w1", 1, 0, ""),
                     Worker("w2", 1, 0, "")};
  for (PlannerWorker& w : request.workers) {
    w.host_id = "machine-a";
    w.host_cpus = 2;
  }
  request.micro_batches = 4;
  request.message_cpu_seconds = 0.0001;
  return request;
}

TEST(SharedCpuStepTest, StagesOnOneMachineShareItsCpus) {
  const std::vector<StageAssignment> stages = {Stage(0, 1, 0), Stage(1, 2, 1),
                                               Stage(2, 3, 2)};
  PlanRequest request = SharedMachineRequest();
  // By hand: passes 3 stages x 4 micro-batches x 3 ms = 36 ms; one update
  // each, 1.5 ms; message ends 4 x 2 per neighbour: 8 + 16 + 8 = 32, at
  // 0.1 ms 3.2 ms. 40.7 ms of CPU on 2 CPUs.
  SharedCpuBound bound = SharedCpuStep(MlpSpec(), request, stages, 1);
  EXPECT_NEAR(bound.seconds, 0.0407 / 2, 1e-12);
  EXPECT_THAT(bound.explanation,
              ::testing::HasSubstr("3 stages on 2 CPUs spend 40.700 ms"));
  EXPECT_THAT(bound.explanation, ::testing::HasSubstr("32 message ends"));

  // A worker twice as fast spends half the CPU on its passes and update.
  request.workers[1].speed = 2;
  bound = SharedCpuStep(MlpSpec(), request, stages, 1);
  EXPECT_NEAR(bound.seconds, (0.0407 - 0.0125 / 2) / 2, 1e-12);

  // Each stage on a machine of its own: the busiest machine (the middle
  // stage's, with two neighbours, at speed 1) sets the floor, and no
  // machine is shared.
  request = SharedMachineRequest();
  for (int w = 0; w < 3; ++w)
    request.workers[w].host_id = "m" + std::to_string(w);
  bound = SharedCpuStep(MlpSpec(), request, stages, 1);
  EXPECT_NEAR(bound.seconds, (0.012 + 0.0005 + 16 * 0.0001) / 2, 1e-12);
  EXPECT_EQ(bound.explanation, "");

  // Machines not known: no floor.
  for (PlannerWorker& w : request.workers) w.host_id.clear();
  EXPECT_EQ(SharedCpuStep(MlpSpec(), request, stages, 1).seconds, 0.0);
}

// A message end takes more CPU the larger its payload: 1024 bytes at
// 0.1 us a byte add 0.1024 ms to each of the 32 ends above.
TEST(SharedCpuStepTest, LargerMessagesTakeMoreOfTheMachinesCpu) {
  const std::vector<StageAssignment> stages = {Stage(0, 1, 0), Stage(1, 2, 1),
                                               Stage(2, 3, 2)};
  PlanRequest request = SharedMachineRequest();
  request.message_cpu_seconds_per_byte = 1e-7;
  const double messages = 32 * (0.0001 + 1024 * 1e-7);
  const SharedCpuBound bound = SharedCpuStep(MlpSpec(), request, stages, 1);
  EXPECT_NEAR(bound.seconds, (0.036 + 0.0015 + messages) / 2, 1e-12);
  EXPECT_THAT(bound.explanation,
              ::testing::HasSubstr("32 message ends 6.477)"));
  // The wire's bytes count, where they differ from the activation's: a
  // gradient of half the bytes on each cut.
  for (LayerCost& layer : request.layers) layer.gradient_wire_bytes = 512;
  EXPECT_NEAR(SharedCpuStep(MlpSpec(), request, stages, 1).seconds,
              (0.036 + 0.0015 + messages - 16 * 512 * 1e-7) / 2, 1e-12);
}

// The floor raises a plan's prediction when it is above the simulated
// step: two stages on one machine with one CPU take the sum of their work.
TEST(SharedCpuStepTest, PlansOnASharedMachineArePredictedAtItsFloor) {
  PlanInputs apart = TwoWorkerInputs(0.0);
  absl::StatusOr<v1::Plan> separate = BuildPlan(apart);
  ASSERT_TRUE(separate.ok()) << separate.status();
  PlanInputs shared = apart;
  for (v1::WorkerInfo& w : shared.workers) {
    w.set_host_id("machine-a");
    w.set_host_cpus(1);
    w.set_message_cpu_seconds(0.0001);
  }
  absl::StatusOr<v1::Plan> together = BuildPlan(shared);
  ASSERT_TRUE(together.ok()) << together.status();
  const int m = shared.spec.training().micro_batches();
  // Both layers' passes over M micro-batches, and 2 M message ends on each
  // side of the one link, on one CPU.
  EXPECT_NEAR(together->predicted_step_seconds(),
              m * 2 * 0.003 + 4 * m * 0.0001, 1e-9);
  EXPECT_GT(together->predicted_step_seconds(),
            separate->predicted_step_seconds());
  EXPECT_THAT(together->explanation(),
              ::testing::HasSubstr("2 stages on 1 CPUs"));
  // Two CPUs each, on machines of their own: no stage waits for a CPU,
  // and each message arrives after its two ends' CPU, as the unshared
  // simulation's over links of 2 x 0.1 ms one way (RTT 0.4 ms).
  for (int w = 0; w < 2; ++w) {
    shared.workers[w].set_host_id("m" + std::to_string(w));
    shared.workers[w].set_host_cpus(2);
  }
  absl::StatusOr<v1::Plan> own = BuildPlan(shared);
  ASSERT_TRUE(own.ok()) << own.status();
  absl::StatusOr<v1::Plan> slower = BuildPlan(TwoWorkerInputs(0.0004));
  ASSERT_TRUE(slower.ok()) << slower.status();
  // (But for the 33 ns each activation takes on the wire, which the ends'
  // CPU covers: the simulation runs them side by side.)
  EXPECT_NEAR(own->predicted_step_seconds(), slower->predicted_step_seconds(),
              1e-7);
  EXPECT_GT(own->predicted_step_seconds(), separate->predicted_step_seconds());
  EXPECT_THAT(own->explanation(),
              ::testing::Not(::testing::HasSubstr("stages on")));
  EXPECT_THAT(own->explanation(),
              ::testing::HasSubstr("sharing their machines' CPUs, 0.100 ms of "
                                   "CPU a message end"));
  EXPECT_THAT(separate->explanation(),
              ::testing::Not(::testing::HasSubstr("sharing")));
}

// The workers' measured CPU per byte of payload: on one CPU the step is
// all the work, each of the 4 M message ends now 0.1 ms plus 2 ns for each
// of the activation's (and the gradient's) 32 KiB on the wire; the
// median over the workers that measured it.
TEST(SharedCpuStepTest, PlansChargeEachMessageEndItsPayloadsCpu) {
  PlanInputs shared = TwoWorkerInputs(0.0);
  for (v1::WorkerInfo& w : shared.workers) {
    w.set_host_id("machine-a");
    w.set_host_cpus(1);
    w.set_message_cpu_seconds(0.0001);
  }
  shared.workers[0].set_message_cpu_seconds_per_byte(2e-9);
  absl::StatusOr<v1::Plan> plan = BuildPlan(shared);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int m = shared.spec.training().micro_batches();
  const double end = 0.0001 + 16 * 512 * 4 * 2e-9;
  EXPECT_NEAR(plan->predicted_step_seconds(), m * 2 * 0.003 + 4 * m * end,
              1e-9);
  EXPECT_THAT(plan->explanation(),
              ::testing::HasSubstr("and 2.000 ms per MB of payload"));
  EXPECT_EQ(MessageCpuPerByte(shared.workers), 2e-9);
  shared.workers[1].set_message_cpu_seconds_per_byte(4e-9);
  shared.workers.push_back(shared.workers[1]);
  EXPECT_EQ(MessageCpuPerByte(shared.workers), 4e-9);
}

// Four layers of equal compute; the activation after layer 0 is small, the
// one after layer 1 (the balanced cut) is 64 MB.
PlanRequest CutRequest(double bandwidth) {
  PlanRequest request;
  request.layers = {
      Layer(0.001, 0.002, 4096, 0), Layer(0.001, 0.002, 64'000'000, 0),
      Layer(0.001, 0.002, 64'000'000, 0), Layer(0.001, 0.002, 4096, 0)};
  request.workers = {Worker("w0", 1, 0, "z"), Worker("w1", 1, 0, "z")};
  request.links[{"w0", "w1"}] = {bandwidth, 0.0001, "probe"};
  request.links[{"w1", "w0"}] = {bandwidth, 0.0001, "probe"};
  request.num_stages = 2;
  request.micro_batches = 8;
  return request;
}

TEST(CutPlacementTest, SlowLinksCutWhereTheActivationIsSmall) {
  // 100 Mb/s: 64 MB take 5 s, far above any stage's compute.
  absl::StatusOr<PipelinePlan> slow = PlanPipeline(CutRequest(12.5e6));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->stages[0].layer_end, 1) << slow->explanation;
  // 100 GB/s: 0.64 ms, hidden behind 6 ms of compute: balance compute.
  absl::StatusOr<PipelinePlan> fast = PlanPipeline(CutRequest(100e9));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->stages[0].layer_end, 2) << fast->explanation;
}

}  // namespace
}  // namespace pipetrain
