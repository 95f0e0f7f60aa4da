#include "scheduler/trace_export.h"

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(TraceOpTest, EveryShortNameReadsBackToItsOp) {
  const struct {
    const char* name;
    OpKind op;
    const char* category;
  } cases[] = {
      {"Load", OpKind::kLoadInput, "data"},
      {"RecvA", OpKind::kRecvActivation, "transfer"},
      {"F", OpKind::kForward, "forward"},
      {"SendA", OpKind::kSendActivation, "transfer"},
      {"Loss", OpKind::kLoss, "loss"},
      {"RecvG", OpKind::kRecvGradient, "transfer"},
      {"B", OpKind::kBackward, "backward"},
      {"BI", OpKind::kBackwardInput, "backward-input"},
      {"W", OpKind::kBackwardWeight, "backward-weight"},
      {"SendG", OpKind::kSendGradient, "transfer"},
      {"Step", OpKind::kOptimizerStep, "optimizer"},
  };
  for (const auto& c : cases) {
    auto op = ParseOpKindShortName(c.name);
    ASSERT_TRUE(op.ok()) << c.name;
    EXPECT_EQ(*op, c.op) << c.name;
    EXPECT_STREQ(OpKindShortName(c.op), c.name);
    EXPECT_STREQ(TraceOpCategory(c.op), c.category) << c.name;
  }
  // Exact names only: no prefix matching ("BX" is not a backward).
  for (const char* bad : {"", "BX", "f", "Forward", "Steps"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseOpKindShortName(bad).status()))
        << bad;
  }
}

TEST(ChromeTraceJsonTest, ValidJsonWithStagesChunksAndSpans) {
  v1::Plan plan;
  v1::PlannedStage* s0 = plan.add_stages();
  s0->set_stage(0);
  s0->set_worker_id("w-\"1\"");  // quoted in the JSON
  for (int c = 0; c < 2; ++c) {
    v1::LayerRange* r = s0->add_chunks();
    r->set_begin(2 * c);
    r->set_end(2 * c + 1);
  }
  v1::TraceEvent event;
  event.set_stage(0);
  event.set_chunk(1);
  event.set_step(7);
  event.set_op("SendG");
  event.set_micro_batch(3);
  event.set_weight_version(6);
  event.set_start_unix_us(1'700'000'000'000'123);
  event.set_end_unix_us(1'700'000'000'000'323);
  auto span = SpanFromEvent(event);
  ASSERT_TRUE(span.ok());
  EXPECT_EQ(SpanName(*span), "SendG3");
  TraceSpan step = *span;
  step.op = OpKind::kOptimizerStep;
  step.start_unix_us -= 100;
  step.end_unix_us = step.start_unix_us - 5;  // clock skew: no negative dur
  step.weight_grad_bytes_run = 5632;
  EXPECT_EQ(SpanName(step), "Step");

  const std::string text = ChromeTraceJson(plan, {*span, step});
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &json).ok())
      << text;
  const auto& events = json.fields().at("traceEvents").list_value().values();
  ASSERT_EQ(events.size(), 5);  // process, 2 threads, 2 spans
  const auto& process = events[0].struct_value().fields();
  EXPECT_EQ(process.at("name").string_value(), "process_name");
  EXPECT_EQ(
      process.at("args").struct_value().fields().at("name").string_value(),
      "stage 0: layers [0, 1) [2, 3) on w-\"1\"");
  EXPECT_EQ(events[2]
                .struct_value()
                .fields()
                .at("args")
                .struct_value()
                .fields()
                .at("name")
                .string_value(),
            "chunk 1: layers [2, 3)");
  const auto& first = events[3].struct_value().fields();
  EXPECT_EQ(first.at("name").string_value(), "Step");
  EXPECT_EQ(first.at("dur").number_value(), 0);
  EXPECT_EQ(first.at("args")
                .struct_value()
                .fields()
                .at("weight_grad_bytes_run")
                .number_value(),
            5632);
  const auto& send = events[4].struct_value().fields();
  EXPECT_EQ(send.at("cat").string_value(), "transfer");
  EXPECT_EQ(send.at("tid").number_value(), 1);
  EXPECT_EQ(send.at("dur").number_value(), 200);
  // Microseconds since the epoch survive exactly (below 2^53).
  EXPECT_EQ(send.at("ts").number_value(), 1'700'000'000'000'123.0);
  EXPECT_EQ(send.at("args").struct_value().fields().at("step").number_value(),
            7);
  // A span that ran no held products says nothing of them.
  EXPECT_EQ(
      send.at("args").struct_value().fields().count("weight_grad_bytes_run"),
      0u);
  v1::TraceEvent unknown = event;
  unknown.set_op("Teleport");
  EXPECT_EQ(SpanFromEvent(unknown).status().message(),
            "stage 0 traced unknown trace op \"Teleport\"");
}

}  // namespace
}  // namespace pipetrain
