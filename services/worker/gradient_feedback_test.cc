// Error feedback on a quantized gradient link: what the receiver decodes,
// summed over many micro-batches, tracks the sum of the true gradients.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "services/wire/frame_codec.h"
#include "services/worker/stage_streams.h"
#include "spec/wire_size.h"

namespace pipetrain {
namespace {

WireFormat GradientsIn(v1::WireQuantization q, bool feedback) {
  WireFormat format;
  format.compression.set_gradients(q);
  format.compression.set_group_size(32);
  format.compression.set_disable_error_feedback(!feedback);
  format.seed = 7;
  return format;
}

// The gradient of micro-batch m: a fixed pattern (gradients change slowly
// from one micro-batch to the next) plus a little noise.
Tensor Gradient(int m, std::mt19937* gen) {
  std::normal_distribution<float> noise(0.0f, 0.001f);
  Tensor t = Tensor::Host({4, 64});
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] = std::sin(0.37f * static_cast<float>(i)) + noise(*gen) +
                 0.001f * static_cast<float>(m);
  }
  return t;
}

struct Drift {
  double worst = 0;            // max over elements of |sum decoded - sum true|
  double last_half_scale = 0;  // half the last message's largest scale
};

// Sends `n` gradient messages through EncodeMessage (with the link's
// feedback state) and a FrameAssembler, summing what the receiver
// decodes against the true gradients.
Drift SendGradients(const WireFormat& format, int n) {
  GradientFeedback feedback;
  FrameAssembler receiver;
  receiver.set_wire_format(format);
  std::mt19937 gen(3);
  std::vector<double> sum_true(4 * 64, 0.0), sum_decoded(4 * 64, 0.0);
  Drift drift;
  const int levels =
      (1 << WireQuantizationBits(format.compression.gradients())) - 1;
  for (int m = 0; m < n; ++m) {
    StageMessage msg;
    msg.kind = MessageKind::kGradient;
    msg.step = m / 4;
    msg.micro_batch = m % 4;
    msg.tensors = {Gradient(m, &gen)};
    float* residual = feedback.ResidualFor(format, msg);
    EXPECT_EQ(residual != nullptr,
              !format.compression.disable_error_feedback());
    // The range the message's groups will have (gradient + residual).
    double worst_scale = 0;
    for (int64_t g0 = 0; g0 < msg.tensors[0].numel(); g0 += 32) {
      double lo = 1e30, hi = -1e30;
      for (int64_t i = g0; i < g0 + 32; ++i) {
        const double v = msg.tensors[0].f32()[i] + (residual ? residual[i] : 0);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      worst_scale = std::max(worst_scale, (hi - lo) / levels);
    }
    drift.last_half_scale = worst_scale / 2;
    auto frames = EncodeMessage("job", msg, format, 100, residual);
    EXPECT_TRUE(frames.ok()) << frames.status();
    std::optional<StageMessage> got;
    for (const grpc::ByteBuffer& f : *frames) {
      auto d = receiver.Add(f);
      EXPECT_TRUE(d.ok()) << d.status();
      if (d->message.has_value()) got = std::move(d->message);
    }
    EXPECT_TRUE(got.has_value());
    for (int64_t i = 0; i < msg.tensors[0].numel(); ++i) {
      sum_true[i] += msg.tensors[0].f32()[i];
      sum_decoded[i] += got->tensors[0].f32()[i];
    }
  }
  for (size_t i = 0; i < sum_true.size(); ++i) {
    drift.worst =
        std::max(drift.worst, std::fabs(sum_decoded[i] - sum_true[i]));
  }
  return drift;
}

// With feedback, after 64 micro-batches the receiver's running sum is off
// by at most the last message's own quantization error (half a scale,
// plus float32 summation slack); without it, the errors of a slowly
// changing gradient pile up to many times that.
TEST(GradientFeedback, SummedGradientsTrackTheTruthOnlyWithFeedback) {
  for (v1::WireQuantization q :
       {v1::WIRE_QUANTIZATION_INT8, v1::WIRE_QUANTIZATION_INT4}) {
    SCOPED_TRACE(v1::WireQuantization_Name(q));
    const Drift with = SendGradients(GradientsIn(q, true), 64);
    EXPECT_LE(with.worst, with.last_half_scale * 1.01 + 1e-5)
        << "summed error beyond one message's quantization error";
    const Drift without = SendGradients(GradientsIn(q, false), 64);
    EXPECT_GT(without.worst, 5 * without.last_half_scale)
        << "without feedback the error should accumulate";
    std::printf(
        "%s: |sum decoded - sum true| max %.3g with feedback, %.3g "
        "without (half a scale: %.3g)\n",
        v1::WireQuantization_Name(q).c_str(), with.worst, without.worst,
        with.last_half_scale);
  }
}

// The residual belongs to one chunk and shape: another shape starts from
// zero, and formats without quantized gradients keep no state.
TEST(GradientFeedback, ResidualsArePerShapeAndOnlyForQuantizedGradients) {
  GradientFeedback feedback;
  const WireFormat format = GradientsIn(v1::WIRE_QUANTIZATION_INT8, true);
  StageMessage a;
  a.kind = MessageKind::kGradient;
  a.tensors = {Tensor::Host({2, 8})};
  float* ra = feedback.ResidualFor(format, a);
  ASSERT_NE(ra, nullptr);
  ra[0] = 1.0f;
  EXPECT_EQ(feedback.ResidualFor(format, a)[0], 1.0f);
  StageMessage b = a;
  b.tensors = {Tensor::Host({3, 8})};
  EXPECT_EQ(feedback.ResidualFor(format, b)[0], 0.0f);
  StageMessage c = a;
  c.chunk = 1;
  EXPECT_EQ(feedback.ResidualFor(format, c)[0], 0.0f);
  feedback.Drop(a);
  EXPECT_EQ(feedback.ResidualFor(format, a)[0], 0.0f);
  StageMessage act = a;
  act.kind = MessageKind::kActivation;
  EXPECT_EQ(feedback.ResidualFor(format, act), nullptr);
  EXPECT_EQ(
      feedback.ResidualFor(GradientsIn(v1::WIRE_QUANTIZATION_NONE, true), a),
      nullptr);
}

}  // namespace
}  // namespace pipetrain
