#include "scheduler/plan_builder.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/schedule.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// Every layer: 1 ms forward, 2 ms backward, 1 KiB out, 4 KiB of weights.
v1::ProfileResponse Profile(int layers) {
  v1::ProfileResponse p;
  p.set_device("test");
  for (int l = 0; l < layers; ++l) {
    v1::LayerProfile* layer = p.add_layers();
    layer->set_layer(l);
    layer->set_forward_seconds(0.001);
    layer->set_backward_seconds(0.002);
    layer->set_activation_bytes(1024);
    layer->set_parameter_bytes(4096);
  }
  return p;
}

PlanInputs Inputs(int layers, int workers, int stages, int64_t memory) {
  PlanInputs in;
  in.job_id = "job-1";
  in.spec.set_num_stages(stages);
  in.spec.mutable_training()->set_micro_batches(4);
  for (int l = 0; l < layers; ++l) {
    in.spec.mutable_training()->mutable_model()->add_layers();
  }
  in.profile = Profile(layers);
  for (int w = 0; w < workers; ++w) {
    v1::WorkerInfo info;
    info.set_id("w-" + std::to_string(w));
    info.set_address("10.0.0." + std::to_string(w) + ":7000");
    info.set_memory_bytes(memory);
    info.set_gemm_gflops(10);
    in.workers.push_back(info);
  }
  in.bubble = [](int k) { return (k - 1) / (4.0 + k - 1); };
  return in;
}

TEST(BuildPlanTest, ContiguousStagesWithThePredictedStep) {
  auto plan = BuildPlan(Inputs(6, 3, 3, 0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 3);
  int next = 0;
  for (const v1::PlannedStage& s : plan->stages()) {
    EXPECT_EQ(s.layer_begin(), next);
    EXPECT_EQ(s.layer_end(), next + 2);
    EXPECT_EQ(s.chunks_size(), 0);
    EXPECT_NEAR(s.compute_seconds(), 0.006, 1e-12);
    next = s.layer_end();
  }
  EXPECT_EQ(plan->job_id(), "job-1");
  // GPipe on K = 3, M = 4, simulated: (M + K - 1) * (F + B) as the bubble
  // says, plus each of the two links' transfer (1 KiB at the intra-zone
  // 10 GB/s, no latency) once on the way down and once back up (fill and
  // drain).
  EXPECT_NEAR(plan->predicted_bubble(), 2.0 / 6, 1e-12);
  const double hop = 1024 / 10e9;
  EXPECT_NEAR(plan->predicted_step_seconds(),
              4 * plan->bottleneck_seconds() / (1 - 2.0 / 6) + 4 * hop, 1e-12);
  EXPECT_NEAR(plan->even_split_bottleneck_seconds(), plan->bottleneck_seconds(),
              1e-12);
  EXPECT_THAT(plan->explanation(), HasSubstr("profiled on w-0 (test)"));
}

// The optimizer's update (once a step) follows each stage's last backward
// pass. Under GPipe the first stage runs the step's last backward, so the
// step grows by exactly its update (two layers of 0.5 ms); the other
// stages' updates end earlier (their last backward ends a whole stage
// backward, 4 ms, before the first stage's).
TEST(BuildPlanTest, TheOptimizerUpdateEndsTheStep) {
  PlanInputs in = Inputs(6, 3, 3, 0);
  auto without = BuildPlan(in);
  ASSERT_TRUE(without.ok()) << without.status();
  for (v1::LayerProfile& l : *in.profile.mutable_layers()) {
    l.set_optimizer_seconds(0.0005);
  }
  auto with = BuildPlan(in);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_NEAR(
      with->predicted_step_seconds() - without->predicted_step_seconds(), 0.001,
      1e-12);
}

// Asynchronous 1F1B updates after every micro-batch: M = 4 updates of the
// slowest stage's layers (here 1 ms of a 2-layer stage) join the step
// predicted from the bubble.
TEST(BuildPlanTest, AsyncOneFOneBPaysAnUpdatePerMicroBatch) {
  PlanInputs in = Inputs(6, 3, 3, 0);
  in.spec.set_schedule(v1::SCHEDULE_ASYNC_1F1B);
  auto without = BuildPlan(in);
  ASSERT_TRUE(without.ok()) << without.status();
  for (v1::LayerProfile& l : *in.profile.mutable_layers()) {
    l.set_optimizer_seconds(0.0005);
  }
  auto with = BuildPlan(in);
  ASSERT_TRUE(with.ok()) << with.status();
  // The steady step of a long run (no flush): M = 4 micro-batches of 6 ms
  // on every stage, plus each of its 4 updates (1 ms: two layers of 0.5),
  // less the sub-microsecond 1 KiB hops the updates overlap.
  EXPECT_NEAR(without->predicted_step_seconds(), 4 * 0.006, 1e-6);
  EXPECT_NEAR(
      with->predicted_step_seconds() - without->predicted_step_seconds(),
      4 * 0.001, 1e-6);
}

// A 1F1B-flush stage holding its weight-gradient products keeps each
// finished micro-batch's linear inputs and output gradients until the
// update (DefersWeightGrads): planned with GPipe's memory bound while its
// micro-batches are small enough to be held, with 1F1B's once a
// micro-batch has kMaxHeldWeightGradRows samples (never held).
TEST(BuildPlanTest, HeldWeightGradientsArePlannedWithGPipesMemory) {
  PlanInputs in = Inputs(6, 2, 2, 0);
  in.spec.mutable_training()->set_batch_size(64);  // 16 samples each
  auto gpipe = BuildPlan(in);
  in.spec.set_schedule(v1::SCHEDULE_1F1B_FLUSH);
  auto held = BuildPlan(in);
  in.spec.mutable_training()->set_batch_size(4 * kMaxHeldWeightGradRows);
  auto large = BuildPlan(in);
  ASSERT_TRUE(gpipe.ok() && held.ok() && large.ok());
  ASSERT_EQ(gpipe->stages_size(), 2);
  ASSERT_EQ(held->stages_size(), 2);
  ASSERT_EQ(large->stages_size(), 2);
  EXPECT_EQ(held->stages(0).memory_bytes(), gpipe->stages(0).memory_bytes());
  // 1F1B: stage 0 holds min(M, K) = 2 micro-batches, GPipe M = 4.
  EXPECT_LT(large->stages(0).memory_bytes(), gpipe->stages(0).memory_bytes());
}

TEST(BuildPlanTest, InterleavedWorkersHoldChunksSAndKPlusS) {
  PlanInputs in = Inputs(8, 2, 2, 1 << 20);
  in.spec.set_schedule(v1::SCHEDULE_INTERLEAVED);
  in.spec.set_virtual_stages(2);
  auto plan = BuildPlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2);
  const int want[2][2][2] = {{{0, 2}, {4, 6}}, {{2, 4}, {6, 8}}};
  for (int s = 0; s < 2; ++s) {
    const v1::PlannedStage& stage = plan->stages(s);
    ASSERT_EQ(stage.chunks_size(), 2);
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(stage.chunks(c).begin(), want[s][c][0]) << s << "/" << c;
      EXPECT_EQ(stage.chunks(c).end(), want[s][c][1]) << s << "/" << c;
    }
    // No contiguous span that would include the other worker's layers.
    EXPECT_EQ(stage.layer_begin(), 0);
    EXPECT_EQ(stage.layer_end(), 0);
    // Two chunks of two layers, 3 ms each.
    EXPECT_NEAR(stage.compute_seconds(), 0.012, 1e-12);
    EXPECT_EQ(stage.memory_limit_bytes(), 1 << 20);
  }
  // Memory by hand (GPipe model, no optimizer state: weights and gradients,
  // plus M = 4 micro-batches of the chunk's activations and input): a chunk
  // is 2 * 8192 + 4 * (2048 + input), input 1024 except for layer 0.
  EXPECT_EQ(plan->stages(0).memory_bytes(),
            (16384 + 4 * 2048) + (16384 + 4 * 3072));
  EXPECT_EQ(plan->stages(1).memory_bytes(), 2 * (16384 + 4 * 3072));
  // Worker 0 sends down from chunk [0, 2) and from [4, 6); worker 1 from
  // [2, 4) around the ring to worker 0; [6, 8) ends the pipeline. 1 KiB
  // down and 1 KiB back, in parallel, over the intra-zone link (10 GB/s).
  const double hop = 1024 / 10e9;
  EXPECT_NEAR(plan->stages(0).transfer_seconds(), 2 * hop, 1e-15);
  EXPECT_NEAR(plan->stages(1).transfer_seconds(), hop, 1e-15);
  // The transfers overlap the compute of other micro-batches, so both
  // workers are the bottleneck (their compute ties).
  EXPECT_NEAR(plan->bottleneck_seconds(), 0.012, 1e-15);
  EXPECT_THAT(plan->explanation(), HasSubstr("layers [0, 2) [4, 6)"));
}

TEST(BuildPlanTest, AnInterleavedWorkerThatCannotHoldItsChunksFailsThePlan) {
  PlanInputs in = Inputs(8, 2, 2, 50000);
  in.spec.set_schedule(v1::SCHEDULE_INTERLEAVED);
  auto plan = BuildPlan(in);
  ASSERT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("worker w-0 (stage 0) cannot hold its chunks [0, 2) "
                        "[4, 6): they need 53248 bytes"));
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("it has 50000 bytes"));
  // Enough for worker 0's 53248 but not worker 1's 57344.
  in = Inputs(8, 2, 2, 55000);
  in.spec.set_schedule(v1::SCHEDULE_INTERLEAVED);
  plan = BuildPlan(in);
  ASSERT_TRUE(absl::IsFailedPrecondition(plan.status()));
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("worker w-1 (stage 1) cannot hold its chunks [2, 4) "
                        "[6, 8): they need 57344 bytes"));
}

// Worker kinds (worker_kinds.h): GEMM noise between workers of one kind
// moves no layer, and another kind is planned at the speed its own profile
// shows.
TEST(BuildPlanTest, WorkersOfOneKindShareASpeedAndOthersTheirProfiles) {
  PlanInputs in = Inputs(6, 3, 3, 0);
  in.workers[1].set_gemm_gflops(14);  // one kind: an even split
  auto even = BuildPlan(in);
  ASSERT_TRUE(even.ok()) << even.status();
  for (const v1::PlannedStage& s : even->stages()) {
    EXPECT_EQ(s.layer_end() - s.layer_begin(), 2) << even->explanation();
  }
  // w-2 is another device: four times the GEMM speed, but the model runs
  // at half speed there (its profile): it takes one layer (6 ms), the
  // others three and two (9 and 6 ms).
  in.workers[2].set_device("other");
  in.workers[2].set_gemm_gflops(40);
  v1::ProfileResponse slow = Profile(6);
  for (v1::LayerProfile& l : *slow.mutable_layers()) {
    l.set_forward_seconds(2 * l.forward_seconds());
    l.set_backward_seconds(2 * l.backward_seconds());
  }
  in.kind_profiles["w-2"] = slow;
  auto plan = BuildPlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int slow_layers = -1;
  for (const v1::PlannedStage& s : plan->stages()) {
    if (s.worker_id() == "w-2") slow_layers = s.layer_end() - s.layer_begin();
  }
  EXPECT_EQ(slow_layers, 1) << plan->explanation();
  EXPECT_NEAR(plan->bottleneck_seconds(), 0.009, 1e-9);
  EXPECT_THAT(plan->explanation(),
              HasSubstr("kind 2: other x1 (w-2): speed 0.5, profiled on w-2"));
  // Without its profile the GEMM ratio would give it the most layers.
  in.kind_profiles.clear();
  auto by_gemm = BuildPlan(in);
  ASSERT_TRUE(by_gemm.ok()) << by_gemm.status();
  EXPECT_THAT(by_gemm->explanation(), HasSubstr("(not profiled)"));
  for (const v1::PlannedStage& s : by_gemm->stages()) {
    if (s.worker_id() == "w-2") {
      EXPECT_GE(s.layer_end() - s.layer_begin(), 3) << by_gemm->explanation();
    }
  }
}

// Extra warm-up (cross-step schedules): stage 0's (K - 1)(1 + extra)
// forwards must fit in a step, which bounds a free stage count, and each
// stage holds the micro-batches its warm-up keeps in flight.
TEST(BuildPlanTest, ExtraWarmUpBoundsTheStagesAndCountsTheirActivations) {
  PlanInputs in = Inputs(6, 4, 0, 0);
  in.spec.set_schedule(v1::SCHEDULE_2BW);
  in.bubble = nullptr;
  auto free = BuildPlan(in);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_GT(free->stages_size(), 2);  // so the bound below changes it
  in.spec.set_extra_warmup(3);        // M = 4: (K - 1) x 4 <= 4, K <= 2
  auto bounded = BuildPlan(in);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(bounded->stages_size(), 2);

  // Two stages either way: stage 0 holds 1 x (1 + 3) + 1 = 5 micro-batches
  // of its layers' 1 KiB activations instead of min(M, 2) = 2.
  in.spec.set_num_stages(2);
  in.spec.set_extra_warmup(0);
  auto plain = BuildPlan(in);
  in.spec.set_extra_warmup(3);
  auto deeper = BuildPlan(in);
  ASSERT_TRUE(plain.ok() && deeper.ok());
  const v1::PlannedStage& a = plain->stages(0);
  const v1::PlannedStage& b = deeper->stages(0);
  ASSERT_EQ(a.layer_end(), b.layer_end());
  EXPECT_EQ(b.memory_bytes() - a.memory_bytes(), 3 * 1024 * b.layer_end());
  // The last stage holds one either way.
  EXPECT_EQ(plain->stages(1).memory_bytes(), deeper->stages(1).memory_bytes());
}

// Auto extra warm-up: ceil(round trip / bottleneck per micro-batch) more
// micro-batches in flight, within a step, and the prediction is the
// simulated steady step with them.
TEST(BuildPlanTest, AutoExtraWarmUpCoversTheSlowestRoundTrip) {
  PlanInputs in = Inputs(6, 2, 2, 0);
  in.spec.set_schedule(v1::SCHEDULE_2BW);
  in.bubble = nullptr;
  in.message_overhead_seconds = 0;  // not a quarter of the probe's RTT
  // A 20 ms round trip between the two workers, both ways.
  for (int w = 0; w < 2; ++w) {
    v1::LinkMeasurement* link = in.workers[w].add_links();
    link->set_to_worker_id(in.workers[1 - w].id());
    link->set_bandwidth_bytes_per_s(1e9);
    link->set_rtt_seconds(0.020);
    link->set_source("probe");
  }
  auto plain = BuildPlan(in);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->extra_warmup(), 0);
  in.spec.set_extra_warmup(-1);
  auto automatic = BuildPlan(in);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  // 3 layers of 3 ms a stage: ceil(20 / 9) + 1 = 4, more than the 3 that
  // M = 4 allows on 2 stages.
  EXPECT_EQ(automatic->extra_warmup(), 3);
  EXPECT_THAT(automatic->explanation(),
              HasSubstr("extra warm-up 3 (auto: slowest link's round trip "
                        "20.000 ms (20.002 ms with transfers and message "
                        "overheads) over the bottleneck's 9.000 ms per "
                        "micro-batch, plus one; at most 3 with M = 4"));
  // Covered: M x 9 ms (and a few microseconds of transfer); without it
  // each micro-batch waits for its gradient.
  EXPECT_NEAR(automatic->predicted_step_seconds(), 0.036, 1e-4);
  EXPECT_GT(plain->predicted_step_seconds(), 0.05);
  // At M = 8 the 4 fit (stage 0 holds 6 micro-batches).
  in.spec.mutable_training()->set_micro_batches(8);
  auto eight = BuildPlan(in);
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(eight->extra_warmup(), 4);
  // No link measured (no latency, 10 GB/s): 1F1B's warm-up has no slack
  // for even the transfers, so one, plus one.
  in.workers[0].clear_links();
  in.workers[1].clear_links();
  auto near = BuildPlan(in);
  ASSERT_TRUE(near.ok()) << near.status();
  EXPECT_EQ(near->extra_warmup(), 2);
  // A fixed value is the plan's as it is.
  in.spec.set_extra_warmup(2);
  auto fixed = BuildPlan(in);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->extra_warmup(), 2);
}

TEST(CheckJobSpecTest, RejectsWhatCannotBePlanned) {
  v1::JobSpec spec;
  for (int l = 0; l < 4; ++l) {
    spec.mutable_training()->mutable_model()->add_layers();
  }
  spec.mutable_training()->set_micro_batches(4);
  EXPECT_TRUE(CheckJobSpec(spec, 1).ok());
  spec.set_num_stages(5);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJobSpec(spec, 9)));
  spec.set_num_stages(3);
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckJobSpec(spec, 2)));
  spec.set_num_stages(2);
  spec.set_vertical_sync(true);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJobSpec(spec, 2)));
  spec.set_vertical_sync(false);
  spec.set_virtual_stages(2);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJobSpec(spec, 2)));
  spec.set_schedule(v1::SCHEDULE_INTERLEAVED);
  EXPECT_TRUE(CheckJobSpec(spec, 2).ok());
  EXPECT_EQ(ChunksPerWorker(spec), 2);
  spec.set_num_stages(3);  // 3 x 2 chunks > 4 layers, and 3 does not divide 4
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJobSpec(spec, 3)));
  spec.set_num_stages(2);
  spec.set_virtual_stages(1);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJobSpec(spec, 2)));
}

// A profile times the layers as the job's stages will run them: with
// weights laid out once a step only where a stage keeps them so (a
// synchronous schedule with several micro-batches; StageCompute::Build).
TEST(ProfileRequestForTest, ReusedWeightsExactlyWhereTheStagesReuseThem) {
  v1::JobSpec spec;
  spec.mutable_training()->set_batch_size(64);
  struct Case {
    v1::ScheduleKindProto schedule;
    int micro_batches;
    bool reuse;
  };
  const Case cases[] = {
      {v1::SCHEDULE_GPIPE, 8, true},  {v1::SCHEDULE_1F1B_FLUSH, 4, true},
      {v1::SCHEDULE_ZB_H1, 8, true},  {v1::SCHEDULE_INTERLEAVED, 8, true},
      {v1::SCHEDULE_GPIPE, 1, false}, {v1::SCHEDULE_ASYNC_1F1B, 8, false},
      {v1::SCHEDULE_2BW, 8, false},
  };
  for (const Case& c : cases) {
    spec.set_schedule(c.schedule);
    spec.mutable_training()->set_micro_batches(c.micro_batches);
    const v1::ProfileRequest request = ProfileRequestFor(spec, 5);
    EXPECT_EQ(request.reuse_weights(), c.reuse)
        << v1::ScheduleKindProto_Name(c.schedule) << " M=" << c.micro_batches;
    EXPECT_EQ(request.repetitions(), 5);
    EXPECT_EQ(request.spec().micro_batches(), c.micro_batches);
  }
}

}  // namespace
}  // namespace pipetrain
