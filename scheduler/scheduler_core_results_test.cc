// What SchedulerCore makes of a job's results: evaluations through the
// pipeline (on request, periodic), their metrics, and the Chrome trace.
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(SchedulerCoreTest, EvaluateOnRequestRunsThroughEveryStage) {
  Start();
  const v1::Job job = RunningJob(10);
  const std::vector<std::string> a = PlannedAddresses(job.id());
  Train(4);
  ASSERT_TRUE(core_->PauseJob(Action(job.id())).ok());
  Train(1);  // the step in progress finishes
  v1::EvaluateRequest request;
  request.set_job_id(job.id());
  request.set_max_samples(500);
  // The fake's stages only answer once all of them are evaluating.
  control_.SetEvaluateWait(std::chrono::seconds(10));
  auto result = core_->Evaluate(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->loss(), 0.75);
  EXPECT_EQ(result->step(), 5);
  const auto calls = control_.CallsOf(Method::kEvaluate);
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& c : calls) EXPECT_EQ(c.arg, 500);
  EXPECT_EQ(AddressSet(calls), std::set<std::string>(a.begin(), a.end()));
  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.state(), v1::JOB_STATE_PAUSED);
  ASSERT_EQ(after.evaluations_size(), 1);
  EXPECT_EQ(after.eval().step(), 5);
  // A stage that refuses fails the request and names itself.
  control_.FailNext(Method::kEvaluate, a[0],
                    absl::FailedPreconditionError("no data"));
  auto refused = core_->Evaluate(request);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("stage 0"));
  EXPECT_EQ(Job(job.id()).evaluations_size(), 1);
}

TEST_F(SchedulerCoreTest, PeriodicEvaluationsReachTheJobAndTheMetrics) {
  Start();
  const v1::Job job = RunningJob(10);
  const std::vector<std::string> a = PlannedAddresses(job.id());
  v1::EvalResult first;
  first.set_step(2);
  first.set_loss(1.5);
  first.set_accuracy(0.25);
  first.set_samples(100);
  v1::EvalResult second = first;
  second.set_step(4);
  second.set_loss(0.5);
  second.set_accuracy(0.875);
  control_.AddPeriodicEvaluation(a[2], first);
  Train(2);
  control_.AddPeriodicEvaluation(a[2], first);  // repeated: ignored
  control_.AddPeriodicEvaluation(a[2], second);
  control_.AddPeriodicEvaluation(a[0], second);  // not the last stage
  Train(2);
  const v1::Job seen = Job(job.id());
  ASSERT_EQ(seen.evaluations_size(), 2);
  EXPECT_EQ(seen.evaluations(0).step(), 2);
  EXPECT_EQ(seen.evaluations(1).step(), 4);
  EXPECT_EQ(seen.eval().step(), 4);
  EXPECT_DOUBLE_EQ(seen.eval().loss(), 0.5);
  const std::string text = metrics_.RenderText();
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("pipetrain_scheduler_eval_loss{job=\"",
                                     job.id(), "\"} 0.5\n")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("pipetrain_scheduler_eval_accuracy{job=\"",
                                     job.id(), "\"} 0.875\n")));
}

TEST_F(SchedulerCoreTest, TheTraceIsChromeJsonWithOneProcessPerStage) {
  Start();
  const v1::Job job = RunningJob(10);
  const std::vector<std::string> a = PlannedAddresses(job.id());
  Train(1);
  for (int s = 0; s < 3; ++s) {
    v1::TraceEvent f;
    f.set_stage(s);
    f.set_op("F");
    f.set_micro_batch(1);
    f.set_start_unix_us(1000 + 100 * s);
    f.set_end_unix_us(1050 + 100 * s);
    v1::TraceEvent b = f;
    b.set_op("B");
    b.set_start_unix_us(2000 - 100 * s);
    b.set_end_unix_us(2080 - 100 * s);
    control_.SetTrace(a[s], {f, b});
  }
  v1::GetJobTraceRequest request;
  request.set_job_id(job.id());
  auto trace = core_->GetJobTrace(request);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->events_size(), 6);
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  trace->chrome_trace_json(), &json)
                  .ok())
      << trace->chrome_trace_json();
  std::set<double> processes;
  std::vector<std::string> names;
  std::vector<double> starts;
  for (const auto& v : json.fields().at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    const std::string ph = e.at("ph").string_value();
    if (e.at("name").string_value() == "process_name") {
      processes.insert(e.at("pid").number_value());
    } else if (ph == "X") {
      names.push_back(e.at("name").string_value() + "@" +
                      absl::StrCat(e.at("pid").number_value()));
      starts.push_back(e.at("ts").number_value());
      if (names.back() == "F1@1") {
        EXPECT_EQ(e.at("dur").number_value(), 50);
        EXPECT_EQ(e.at("cat").string_value(), "forward");
      }
    }
  }
  EXPECT_EQ(processes, (std::set<double>{0, 1, 2}));
  EXPECT_THAT(names,
              ElementsAre("F1@0", "F1@1", "F1@2", "B1@2", "B1@1", "B1@0"));
  EXPECT_THAT(starts, ElementsAre(1000, 1100, 1200, 1800, 1900, 2000));

  v1::TraceEvent odd;
  odd.set_op("Teleport");
  control_.SetTrace(a[1], {odd});
  EXPECT_TRUE(absl::IsInvalidArgument(core_->GetJobTrace(request).status()));
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
