#include "scheduler/trace_export.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain {
namespace {

// A JSON string literal (quotes included) for `text`.
std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string RangeText(int begin, int end) {
  return absl::StrCat("[", begin, ", ", end, ")");
}

// "layers [0, 2) on w-1", or "layers [0, 1) [2, 3) on w-1" with chunks.
std::string StageLabel(const v1::PlannedStage& s) {
  std::string layers;
  if (s.chunks_size() == 0) {
    layers = RangeText(s.layer_begin(), s.layer_end());
  }
  for (const v1::LayerRange& r : s.chunks()) {
    absl::StrAppend(&layers, layers.empty() ? "" : " ",
                    RangeText(r.begin(), r.end()));
  }
  return absl::StrCat("stage ", s.stage(), ": layers ", layers, " on ",
                      s.worker_id());
}

void AppendMetadata(const v1::Plan& plan, std::vector<std::string>* events) {
  for (const v1::PlannedStage& s : plan.stages()) {
    events->push_back(absl::StrFormat(
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
        "\"name\":%s}}",
        s.stage(), JsonString(StageLabel(s))));
    const int chunks = std::max(1, s.chunks_size());
    for (int c = 0; c < chunks; ++c) {
      const std::string name =
          s.chunks_size() == 0
              ? std::string("layers ") +
                    RangeText(s.layer_begin(), s.layer_end())
              : absl::StrCat("chunk ", c, ": layers ",
                             RangeText(s.chunks(c).begin(), s.chunks(c).end()));
      events->push_back(absl::StrFormat(
          "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
          "\"args\":{\"name\":%s}}",
          s.stage(), c, JsonString(name)));
    }
  }
}

std::string SpanJson(const TraceSpan& span) {
  const std::string held =
      span.weight_grad_bytes_run > 0
          ? absl::StrFormat(",\"weight_grad_bytes_run\":%d",
                            span.weight_grad_bytes_run)
          : "";
  return absl::StrFormat(
      "{\"name\":%s,\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
      "\"ts\":%d,\"dur\":%d,\"args\":{\"step\":%d,\"micro_batch\":%d,"
      "\"weight_version\":%d%s}}",
      JsonString(SpanName(span)), TraceOpCategory(span.op), span.stage,
      span.chunk, span.start_unix_us,
      std::max<int64_t>(0, span.end_unix_us - span.start_unix_us), span.step,
      span.micro_batch, span.weight_version, held);
}

}  // namespace

const char* TraceOpCategory(OpKind op) {
  switch (op) {
    case OpKind::kLoadInput:
      return "data";
    case OpKind::kRecvActivation:
    case OpKind::kSendActivation:
    case OpKind::kRecvGradient:
    case OpKind::kSendGradient:
      return "transfer";
    case OpKind::kForward:
      return "forward";
    case OpKind::kLoss:
      return "loss";
    case OpKind::kBackward:
      return "backward";
    case OpKind::kBackwardInput:
      return "backward-input";
    case OpKind::kBackwardWeight:
      return "backward-weight";
    case OpKind::kOptimizerStep:
      return "optimizer";
  }
  return "other";
}

absl::StatusOr<TraceSpan> SpanFromEvent(const v1::TraceEvent& event) {
  absl::StatusOr<OpKind> op = ParseOpKindShortName(event.op());
  if (!op.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", event.stage(), " traced ", op.status().message()));
  }
  TraceSpan span;
  span.stage = event.stage();
  span.chunk = event.chunk();
  span.step = event.step();
  span.op = *op;
  span.micro_batch = event.micro_batch();
  span.weight_version = event.weight_version();
  span.weight_grad_bytes_run = event.weight_grad_bytes_run();
  span.start_unix_us = event.start_unix_us();
  span.end_unix_us = event.end_unix_us();
  return span;
}

std::string SpanName(const TraceSpan& span) {
  if (span.op == OpKind::kOptimizerStep) return OpKindShortName(span.op);
  return absl::StrCat(OpKindShortName(span.op), span.micro_batch);
}

std::string ChromeTraceJson(const v1::Plan& plan,
                            const std::vector<TraceSpan>& spans) {
  std::vector<std::string> events;
  AppendMetadata(plan, &events);
  std::vector<const TraceSpan*> ordered;
  for (const TraceSpan& s : spans) ordered.push_back(&s);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const TraceSpan* a, const TraceSpan* b) {
                     return a->start_unix_us < b->start_unix_us;
                   });
  for (const TraceSpan* s : ordered) events.push_back(SpanJson(*s));
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  for (size_t i = 0; i < events.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", events[i]);
  }
  return out + "]}";
}

}  // namespace pipetrain
