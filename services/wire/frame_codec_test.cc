#include "services/wire/frame_codec.h"

#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "services/wire/quantize.h"
#include "spec/wire_size.h"
#include "worker/compute/half.h"

namespace pipetrain {
namespace {

Tensor Iota(const Shape& shape, DType dtype = DType::kF32) {
  Tensor t = Tensor::Host(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF32) {
      t.f32()[i] = static_cast<float>(i) * 0.5f;
    } else {
      t.u16()[i] = FloatToBf16(static_cast<float>(i));
    }
  }
  return t;
}

StageMessage RoundTrip(const StageMessage& in, size_t chunk, int* frames,
                       v1::DType wire = v1::DTYPE_F32) {
  auto encoded = EncodeMessage("job", in, wire, chunk);
  EXPECT_TRUE(encoded.ok()) << encoded.status();
  *frames = static_cast<int>(encoded->size());
  FrameAssembler assembler;
  assembler.set_wire_dtype(wire);
  std::optional<StageMessage> out;
  for (size_t i = 0; i < encoded->size(); ++i) {
    auto decoded = assembler.Add((*encoded)[i]);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->header.job_id(), "job");
    EXPECT_EQ(decoded->message.has_value(), i + 1 == encoded->size());
    if (decoded->message) out = std::move(decoded->message);
  }
  EXPECT_EQ(assembler.pending(), 0u);
  return out.value_or(StageMessage());
}

// Values that bf16 and fp16 must round.
Tensor Fractions(const Shape& shape) {
  Tensor t = Tensor::Host(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.f32()[i] = 1.0f + static_cast<float>(i) / 1000.0f - (i % 3) * 0.37f;
  }
  return t;
}

// A float32 activation narrowed to the wire dtype and widened back: each
// element rounds once (to nearest even), a second tensor (the codec takes
// any number; stages send one) arrives exactly, and the message survives
// being cut into frames anywhere an element allows.
TEST(FrameCodec, MessagesSurviveChunkingAcrossTensorBoundaries) {
  StageMessage in;
  in.kind = MessageKind::kActivation;
  in.step = 12;
  in.micro_batch = 3;
  in.weight_version = 7;
  in.samples = 60000;
  // An odd-sized 16-bit tensor forces an alignment gap before the second.
  in.tensors = {Fractions({5, 7}), Fractions({5})};
  for (v1::DType wire : {v1::DTYPE_BF16, v1::DTYPE_F16}) {
    for (size_t chunk : {size_t{8}, size_t{24}, size_t{72}, size_t{1000},
                         kDefaultChunkBytes}) {
      SCOPED_TRACE(::testing::Message()
                   << v1::DType_Name(wire) << " " << chunk);
      int frames = 0;
      StageMessage out = RoundTrip(in, chunk, &frames, wire);
      // 70 bytes of 16-bit activation, a 2-byte gap, 20 bytes of float32.
      EXPECT_EQ(frames, static_cast<int>((92 + chunk - 1) / chunk));
      EXPECT_EQ(out.kind, in.kind);
      EXPECT_EQ(out.step, 12);
      EXPECT_EQ(out.micro_batch, 3);
      EXPECT_EQ(out.weight_version, 7);
      EXPECT_EQ(out.samples, 60000);
      ASSERT_EQ(out.tensors.size(), 2u);
      EXPECT_EQ(out.tensors[0].dtype(), DType::kF32);
      EXPECT_EQ(out.tensors[0].shape(), (Shape{5, 7}));
      const std::vector<float> sent = in.tensors[0].ToVector();
      const std::vector<float> got = out.tensors[0].ToVector();
      for (size_t i = 0; i < sent.size(); ++i) {
        const float want = wire == v1::DTYPE_BF16
                               ? Bf16ToFloat(FloatToBf16(sent[i]))
                               : HalfToFloat(FloatToHalf(sent[i]));
        EXPECT_EQ(got[i], want) << i;
      }
      EXPECT_NE(got, sent);  // the wire really narrowed them
      EXPECT_EQ(out.tensors[1].ToVector(), in.tensors[1].ToVector());
    }
  }
}

TEST(FrameCodec, FloatWireIsExactAndEvaluationActivationsTravel) {
  StageMessage in;
  in.kind = MessageKind::kEvalActivation;
  in.step = 2;
  in.micro_batch = 40;
  in.value = 1.0;
  in.samples = 10000;
  in.tensors = {Fractions({3, 5})};
  int frames = 0;
  StageMessage out = RoundTrip(in, 24, &frames);
  EXPECT_EQ(out.kind, MessageKind::kEvalActivation);
  EXPECT_EQ(out.micro_batch, 40);
  EXPECT_EQ(out.value, 1.0);
  EXPECT_EQ(out.samples, 10000);
  ASSERT_EQ(out.tensors.size(), 1u);
  EXPECT_EQ(out.tensors[0].ToVector(), in.tensors[0].ToVector());
  EXPECT_EQ(WirePayloadBytes(in, v1::DTYPE_F32), 4 * 15);
  EXPECT_EQ(WirePayloadBytes(in, v1::DTYPE_BF16), 2 * 15);
}

// The decoder takes payloads only in the wire dtype it was told, and any
// other tensor only as float32.
TEST(FrameCodec, TensorsInUnexpectedDTypesAreRejected) {
  StageMessage in;
  in.kind = MessageKind::kGradient;
  in.tensors = {Fractions({4, 4})};
  struct Case {
    v1::DType sent;
    v1::DType expected;
  };
  for (Case c : {Case{v1::DTYPE_BF16, v1::DTYPE_F32},
                 Case{v1::DTYPE_F32, v1::DTYPE_BF16},
                 Case{v1::DTYPE_F16, v1::DTYPE_BF16}}) {
    auto frames = EncodeMessage("job", in, c.sent);
    ASSERT_TRUE(frames.ok());
    FrameAssembler assembler;
    assembler.set_wire_dtype(c.expected);
    const absl::Status status = assembler.Add((*frames)[0]).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("wire dtype"), std::string::npos) << status;
  }
  // A bf16 second tensor: tensors other than the payload travel as they
  // are, and arrive as what they are.
  StageMessage act;
  act.kind = MessageKind::kActivation;
  act.tensors = {Fractions({2, 4}), Iota({2}, DType::kBF16)};
  auto frames = EncodeMessage("job", act, v1::DTYPE_BF16);
  ASSERT_TRUE(frames.ok());
  FrameAssembler assembler;
  assembler.set_wire_dtype(v1::DTYPE_BF16);
  EXPECT_EQ(assembler.Add((*frames)[0]).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      EncodeMessage("job", act, static_cast<v1::DType>(9)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(FrameCodec, LargeTensorsTravelInOneMebibyteFrames) {
  StageMessage in;
  in.kind = MessageKind::kGradient;
  in.tensors = {Iota({3 << 18, 2})};  // 6 MiB
  int frames = 0;
  StageMessage out = RoundTrip(in, kDefaultChunkBytes, &frames);
  EXPECT_EQ(frames, 6);
  EXPECT_EQ(out.tensors[0].ToVector(), in.tensors[0].ToVector());
}

TEST(FrameCodec, EncodingDoesNotCopyThePayload) {
  StageMessage in;
  in.tensors = {Iota({1024})};
  auto frames = EncodeMessage("job", in, v1::DTYPE_F32);
  ASSERT_TRUE(frames.ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE((*frames)[0].Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()), in.tensors[0].raw());
  // The frame keeps the tensor's storage alive.
  EXPECT_GE(in.tensors[0].storage().use_count(), 2);

  // Narrowed, the payload is written straight into the frame instead.
  frames = EncodeMessage("job", in, v1::DTYPE_BF16);
  ASSERT_TRUE(frames.ok());
  slices.clear();
  ASSERT_TRUE((*frames)[0].Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  ASSERT_EQ(slices[1].size(), 2048u);
  const uint16_t* wire = reinterpret_cast<const uint16_t*>(slices[1].begin());
  for (int i = 0; i < 1024; ++i) {
    ASSERT_EQ(wire[i], FloatToBf16(in.tensors[0].f32()[i])) << i;
  }
}

TEST(FrameCodec, NormMessagesHaveNoPayload) {
  StageMessage in;
  in.kind = MessageKind::kNormPartial;
  in.step = 4;
  in.value = 2.5;
  int frames = 0;
  StageMessage out = RoundTrip(in, kDefaultChunkBytes, &frames);
  EXPECT_EQ(frames, 1);
  EXPECT_EQ(out.kind, MessageKind::kNormPartial);
  EXPECT_EQ(out.value, 2.5);
}

TEST(FrameCodec, MalformedFramesAreRejected) {
  FrameAssembler assembler;
  grpc::Slice junk(
      std::string("\xff\xff\xff\x7f"
                  "abc",
                  7));
  EXPECT_EQ(assembler.Add(grpc::ByteBuffer(&junk, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A header whose byte count does not match its tensors.
  v1::FrameHeader header;
  header.set_kind(v1::FRAME_KIND_ACTIVATION);
  header.add_tensors()->add_shape(4);
  header.set_total_bytes(12);
  std::string bytes = header.SerializeAsString();
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(bytes.size());
  frame += bytes;
  grpc::Slice bad(frame);
  auto status = assembler.Add(grpc::ByteBuffer(&bad, 1)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("16"), std::string::npos) << status;

  // Frames out of order.
  StageMessage in;
  in.tensors = {Iota({64})};
  auto frames = EncodeMessage("job", in, v1::DTYPE_F32, 64);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 4u);
  EXPECT_EQ(assembler.Add((*frames)[1]).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(assembler.Add((*frames)[0]).ok());
  EXPECT_EQ(assembler.Add((*frames)[2]).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A continuation frame whose header describes other tensors with the same
  // byte count: bf16 [32] then [16, 2] would widen into a differently laid
  // out buffer. The message is dropped, nothing is written.
  StageMessage act;
  act.tensors = {Iota({32})};
  auto narrow = EncodeMessage("job", act, v1::DTYPE_BF16, 32);
  ASSERT_TRUE(narrow.ok());
  ASSERT_EQ(narrow->size(), 2u);
  act.tensors = {Iota({16, 2})};
  auto reshaped = EncodeMessage("job", act, v1::DTYPE_BF16, 32);
  ASSERT_TRUE(reshaped.ok());
  FrameAssembler wire16;
  wire16.set_wire_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(wire16.Add((*narrow)[0]).ok());
  auto changed = wire16.Add((*reshaped)[1]).status();
  EXPECT_EQ(changed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(changed.message().find("changes its message's header"),
            std::string::npos)
      << changed;
  EXPECT_EQ(wire16.pending(), 0u);

  // Nor may it change the split size an activation names.
  StageMessage named;
  named.tensors = {Iota({32})};
  named.samples = 100;
  auto first = EncodeMessage("job", named, v1::DTYPE_F32, 64);
  named.samples = 99;
  auto second = EncodeMessage("job", named, v1::DTYPE_F32, 64);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(first->size(), 2u);
  FrameAssembler wire32;
  ASSERT_TRUE(wire32.Add((*first)[0]).ok());
  EXPECT_EQ(wire32.Add((*second)[1]).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wire32.pending(), 0u);

  // A first frame cut inside an element (6 of its 64 payload bytes): a
  // narrowed element could straddle two frames.
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE((*frames)[0].Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  grpc::Slice cut[2] = {slices[0], grpc::Slice(slices[1].begin(), 6)};
  FrameAssembler fresh;
  auto status2 = fresh.Add(grpc::ByteBuffer(cut, 2)).status();
  EXPECT_EQ(status2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status2.message().find("multiples of 8"), std::string::npos)
      << status2;
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

// The frames of a gradient message with one [rows, 64] float32 tensor, cut
// into 1 KiB frames.
std::vector<grpc::ByteBuffer> Chunked(int64_t step, int64_t rows) {
  StageMessage m;
  m.kind = MessageKind::kGradient;
  m.step = step;
  m.tensors = {Tensor::Host({rows, 64})};
  auto frames = EncodeMessage("job", m, v1::DTYPE_F32, 1024);
  EXPECT_TRUE(frames.ok()) << frames.status();
  return *frames;
}

TEST(FrameCodec, TheHeaderCheckRunsBeforeAnythingIsAllocated) {
  std::shared_ptr<HostBufferPool> pool = HostBufferPool::Create(1 << 20);
  FrameAssembler assembler(pool);
  std::vector<Shape> seen;
  assembler.set_header_check(
      [&seen](MessageKind kind, const v1::FrameHeader& h) {
        const StageMessage outline = MessageOutline(kind, h);
        seen.push_back(outline.tensors.at(0).shape());
        if (outline.tensors[0].dim(0) > 4) {
          return absl::InvalidArgumentError("too many rows");
        }
        return absl::OkStatus();
      });
  const absl::Status rejected = assembler.Add(Chunked(0, 8)[0]).status();
  EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rejected.message(), "too many rows");
  EXPECT_EQ(assembler.pending(), 0u);
  // A buffer taken and dropped would now sit in the pool's cache.
  EXPECT_EQ(pool->cached_bytes(), 0u);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (Shape{8, 64}));
  for (const grpc::ByteBuffer& f : Chunked(0, 4)) {
    ASSERT_TRUE(assembler.Add(f).ok());
  }
  EXPECT_EQ(seen.size(), 1u + 1u);  // 4 x 64 floats: one frame
}

TEST(FrameCodec, PartialMessagesAreBounded) {
  FrameAssembler assembler;
  assembler.set_max_partial_messages(2);
  // Three messages begun and never finished: the third is refused.
  ASSERT_TRUE(assembler.Add(Chunked(0, 16)[0]).ok());
  ASSERT_TRUE(assembler.Add(Chunked(1, 16)[0]).ok());
  const absl::Status third = assembler.Add(Chunked(2, 16)[0]).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(assembler.pending(), 2u);
  // A replayed first frame of a message in assembly is out of order, and
  // the message it would have disturbed is dropped, not corrupted.
  const absl::Status replay = assembler.Add(Chunked(0, 16)[0]).status();
  EXPECT_EQ(replay.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(assembler.pending(), 1u);
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

TEST(FrameCodec, UnfinishedMessagesAreEvictedAfterTheTimeout) {
  absl::Time now = absl::UnixEpoch();
  FrameAssembler assembler;
  assembler.set_max_partial_messages(2);
  assembler.set_partial_message_timeout(absl::Seconds(10));
  assembler.set_clock([&now] { return now; });
  const std::vector<grpc::ByteBuffer> slow = Chunked(0, 16);
  const std::vector<grpc::ByteBuffer> stuck = Chunked(1, 16);
  ASSERT_GE(slow.size(), 3u);
  ASSERT_TRUE(assembler.Add(slow[0]).ok());
  ASSERT_TRUE(assembler.Add(stuck[0]).ok());
  // The slow message keeps receiving frames within the timeout; the stuck
  // one receives none.
  now += absl::Seconds(8);
  ASSERT_TRUE(assembler.Add(slow[1]).ok());
  EXPECT_EQ(assembler.evicted(), 0);
  now += absl::Seconds(8);
  ASSERT_TRUE(assembler.Add(slow[2]).ok());
  EXPECT_EQ(assembler.evicted(), 1);
  EXPECT_EQ(assembler.pending(), 1u);
  // Its place is free again: a new message may start (the cap is 2) ...
  ASSERT_TRUE(assembler.Add(Chunked(2, 16)[0]).ok());
  EXPECT_EQ(assembler.pending(), 2u);
  // ... and the stuck message's late frame is out of order, not resumed.
  EXPECT_EQ(assembler.Add(stuck[1]).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The slow message still completes.
  std::optional<StageMessage> done;
  for (size_t i = 3; i < slow.size(); ++i) {
    auto decoded = assembler.Add(slow[i]);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (decoded->message) done = std::move(decoded->message);
  }
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->step, 0);
}

// ---- Quantized wire (WireCompression) ----

WireFormat Quantized(v1::WireQuantization activations,
                     v1::WireQuantization gradients, int32_t group_size = 0) {
  WireFormat format;
  format.compression.set_activations(activations);
  format.compression.set_gradients(gradients);
  format.compression.set_group_size(group_size);
  format.seed = 99;
  return format;
}

Tensor Normal(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.2f, 2.0f);
  Tensor t = Tensor::Host(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(gen);
  return t;
}

// The largest scale of the groups of `t`'s rows ((max - min) / levels,
// from the input): the bound of nearest rounding is half of it.
double MaxScale(const Tensor& t, int64_t group, int bits) {
  const int64_t cols = t.shape().back();
  double worst = 0;
  for (int64_t row = 0; row < t.numel() / cols; ++row) {
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      double lo = 1e30, hi = -1e30;
      for (int64_t j = g0; j < std::min(cols, g0 + group); ++j) {
        lo = std::min<double>(lo, t.f32()[row * cols + j]);
        hi = std::max<double>(hi, t.f32()[row * cols + j]);
      }
      worst = std::max(worst, (hi - lo) / ((1 << bits) - 1));
    }
  }
  return worst;
}

// Frames through an assembler expecting `format`; the message, or the
// first error.
absl::StatusOr<StageMessage> Assemble(
    const std::vector<grpc::ByteBuffer>& frames, const WireFormat& format) {
  FrameAssembler assembler;
  assembler.set_wire_format(format);
  for (const grpc::ByteBuffer& f : frames) {
    absl::StatusOr<DecodedFrame> d = assembler.Add(f);
    if (!d.ok()) return d.status();
    if (d->message.has_value()) return std::move(*d->message);
  }
  return absl::InternalError("no message completed");
}

// A quantized activation survives frames cut anywhere a multiple of 8
// bytes allows, whatever that does to its rows (odd row byte counts, rows
// longer than a frame, frames holding several rows): every element within
// half its group's scale of the input, in the frames' dtype and group
// size, in spec/wire_size's byte count. A gradient of a job that only
// quantizes activations travels exactly.
TEST(FrameCodec, QuantizedMessagesSurviveAnyChunking) {
  struct Case {
    v1::WireQuantization q;
    int bits;
    int32_t group;  // requested (0: default)
    Shape shape;
  };
  for (const Case& c : {Case{v1::WIRE_QUANTIZATION_INT8, 8, 0, {6, 37}},
                        Case{v1::WIRE_QUANTIZATION_INT8, 8, 16, {3, 300}},
                        Case{v1::WIRE_QUANTIZATION_INT4, 4, 0, {6, 37}},
                        Case{v1::WIRE_QUANTIZATION_INT4, 4, 5, {2, 3, 21}},
                        Case{v1::WIRE_QUANTIZATION_INT4, 4, 1000, {9}}}) {
    const WireFormat format =
        Quantized(c.q, v1::WIRE_QUANTIZATION_NONE, c.group);
    StageMessage in;
    in.kind = MessageKind::kActivation;
    in.step = 3;
    in.tensors = {Normal(c.shape, 5)};
    const int64_t cols = c.shape.back();
    const int64_t group = EffectiveWireGroupSize(c.group, cols);
    const int64_t wire_bytes =
        StreamedTensorWireBytes(c.shape, v1::DTYPE_F32, c.q, c.group);
    EXPECT_EQ(WirePayloadBytes(in, format), wire_bytes);
    const double bound = MaxScale(in.tensors[0], group, c.bits) / 2 * 1.0001;
    for (size_t chunk :
         {size_t{8}, size_t{24}, size_t{40}, size_t{136}, kDefaultChunkBytes}) {
      SCOPED_TRACE(::testing::Message() << c.bits << " bits, group " << c.group
                                        << ", chunk " << chunk);
      auto frames = EncodeMessage("job", in, format, chunk);
      ASSERT_TRUE(frames.ok()) << frames.status();
      EXPECT_EQ(frames->size(),
                static_cast<size_t>((wire_bytes + chunk - 1) / chunk));
      absl::StatusOr<StageMessage> out = Assemble(*frames, format);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->tensors.size(), 1u);
      EXPECT_EQ(out->tensors[0].shape(), c.shape);
      EXPECT_EQ(out->step, 3);
      for (int64_t i = 0; i < in.tensors[0].numel(); ++i) {
        ASSERT_NEAR(out->tensors[0].f32()[i], in.tensors[0].f32()[i], bound)
            << "element " << i;
      }
    }
    // What the frames declare.
    auto frames = EncodeMessage("job", in, format);
    ASSERT_TRUE(frames.ok());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE((*frames)[0].Dump(&slices).ok());
    FrameAssembler probe;
    probe.set_wire_format(format);
    auto decoded = probe.Add((*frames)[0]);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded->header.tensors(0).dtype(),
              c.bits == 8 ? v1::DTYPE_INT8 : v1::DTYPE_INT4);
    EXPECT_EQ(decoded->header.tensors(0).group_size(), group);
    EXPECT_EQ(decoded->header.total_bytes(), wire_bytes);

    // Gradients are not quantized by this format: exact.
    StageMessage grad = in;
    grad.kind = MessageKind::kGradient;
    EXPECT_EQ(WirePayloadBytes(grad, format), in.tensors[0].numel() * 4);
    auto grad_frames = EncodeMessage("job", grad, format, 24);
    ASSERT_TRUE(grad_frames.ok());
    absl::StatusOr<StageMessage> exact = Assemble(*grad_frames, format);
    ASSERT_TRUE(exact.ok()) << exact.status();
    EXPECT_EQ(exact->tensors[0].ToVector(), in.tensors[0].ToVector());
  }
}

// Evaluation activations follow the activations' setting; stochastic
// rounding encodes the same bytes for the same message and seed.
TEST(FrameCodec, StochasticRoundingIsSeededPerMessage) {
  WireFormat format =
      Quantized(v1::WIRE_QUANTIZATION_INT8, v1::WIRE_QUANTIZATION_INT8);
  format.compression.set_rounding(v1::WIRE_ROUNDING_STOCHASTIC);
  StageMessage in;
  in.kind = MessageKind::kEvalActivation;
  in.tensors = {Normal({4, 64}, 8)};
  auto bytes_of = [&](const StageMessage& m, const WireFormat& f) {
    auto frames = EncodeMessage("job", m, f);
    EXPECT_TRUE(frames.ok());
    std::string out;
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE((*frames)[0].Dump(&slices).ok());
    for (const grpc::Slice& s : slices) {
      out.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return out;
  };
  const std::string first = bytes_of(in, format);
  EXPECT_EQ(bytes_of(in, format), first);
  StageMessage next = in;
  next.micro_batch = 1;  // another micro-batch: other uniforms
  EXPECT_NE(bytes_of(next, format).substr(first.size() - 200),
            first.substr(first.size() - 200));
  absl::StatusOr<StageMessage> out =
      Assemble(*EncodeMessage("job", in, format), format);
  ASSERT_TRUE(out.ok()) << out.status();
  const double scale = MaxScale(in.tensors[0], 64, 8);
  for (int64_t i = 0; i < in.tensors[0].numel(); ++i) {
    ASSERT_NEAR(out->tensors[0].f32()[i], in.tensors[0].f32()[i],
                scale * 1.0001);
  }
}

// A copy of `frame` with its header edited.
grpc::ByteBuffer EditedFrame(
    const grpc::ByteBuffer& frame,
    const std::function<void(v1::FrameHeader*)>& edit) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(frame.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const uint32_t n = static_cast<uint8_t>(bytes[0]) |
                     (static_cast<uint8_t>(bytes[1]) << 8) |
                     (static_cast<uint8_t>(bytes[2]) << 16);
  v1::FrameHeader header;
  EXPECT_TRUE(header.ParseFromString(bytes.substr(4, n)));
  edit(&header);
  const std::string h = header.SerializeAsString();
  std::string out(4, '\0');
  out[0] = static_cast<char>(h.size() & 0xff);
  out[1] = static_cast<char>((h.size() >> 8) & 0xff);
  out += h;
  out += bytes.substr(4 + n);
  grpc::Slice slice(out);
  return grpc::ByteBuffer(&slice, 1);
}

// The receiver accepts only the format its job's compression says: the
// quantization, the group size it gives rows of the tensor's length, and
// the byte count spec/wire_size gives them.
TEST(FrameCodec, QuantizedFramesInTheWrongFormatAreRejected) {
  const WireFormat int8 =
      Quantized(v1::WIRE_QUANTIZATION_INT8, v1::WIRE_QUANTIZATION_INT8, 16);
  StageMessage in;
  in.kind = MessageKind::kGradient;
  in.tensors = {Normal({4, 40}, 1)};
  auto expect_rejected = [&](const std::vector<grpc::ByteBuffer>& frames,
                             const std::string& why) {
    const absl::Status status = Assemble(frames, int8).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(why), std::string::npos) << status;
  };
  // f32 where int8 is expected.
  expect_rejected(*EncodeMessage("job", in, v1::DTYPE_F32),
                  "travels as f32, expected int8");
  // int4, and int8 in groups of another size.
  expect_rejected(*EncodeMessage("job", in,
                                 Quantized(v1::WIRE_QUANTIZATION_INT4,
                                           v1::WIRE_QUANTIZATION_INT4, 16)),
                  "travels as int4, expected int8");
  expect_rejected(*EncodeMessage("job", in,
                                 Quantized(v1::WIRE_QUANTIZATION_INT8,
                                           v1::WIRE_QUANTIZATION_INT8, 8)),
                  "groups of 8, expected 16");
  // int8 frames where f32 is expected.
  const absl::Status f32 =
      Assemble(*EncodeMessage("job", in, int8), WireFormat()).status();
  EXPECT_NE(f32.message().find("travels as int8, expected f32"),
            std::string::npos)
      << f32;
  // The right format with a byte count that is not the formula's, and
  // with a group size the tensor cannot have.
  const std::vector<grpc::ByteBuffer> good = *EncodeMessage("job", in, int8);
  ASSERT_TRUE(Assemble(good, int8).ok());
  const int64_t bytes = StreamedTensorWireBytes({4, 40}, v1::DTYPE_F32,
                                                v1::WIRE_QUANTIZATION_INT8, 16);
  expect_rejected(
      {EditedFrame(good[0],
                   [&](v1::FrameHeader* h) { h->set_total_bytes(bytes + 8); })},
      absl::StrCat("need ", bytes));
  const WireFormat whole_rows =
      Quantized(v1::WIRE_QUANTIZATION_INT8, v1::WIRE_QUANTIZATION_INT8, 0);
  const absl::Status bad_group =
      Assemble({EditedFrame(good[0],
                            [](v1::FrameHeader* h) {
                              h->mutable_tensors(0)->set_group_size(0);
                            })},
               whole_rows)
          .status();
  EXPECT_EQ(bad_group.code(), absl::StatusCode::kInvalidArgument) << bad_group;
  // A tensor that is not quantized may not declare a group size.
  const absl::Status stray =
      Assemble({EditedFrame((*EncodeMessage("job", in, v1::DTYPE_F32))[0],
                            [](v1::FrameHeader* h) {
                              h->mutable_tensors(0)->set_group_size(4);
                            })},
               WireFormat())
          .status();
  EXPECT_EQ(stray.code(), absl::StatusCode::kInvalidArgument) << stray;
}

// A payload holding NaN is refused at the sender, not sent as garbage.
TEST(FrameCodec, NonFinitePayloadsAreNotQuantized) {
  StageMessage in;
  in.kind = MessageKind::kActivation;
  in.tensors = {Normal({2, 8}, 1)};
  in.tensors[0].f32()[5] = std::nanf("");
  const absl::Status status =
      EncodeMessage(
          "job", in,
          Quantized(v1::WIRE_QUANTIZATION_INT4, v1::WIRE_QUANTIZATION_NONE))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("NaN"), std::string::npos) << status;
}

}  // namespace
}  // namespace pipetrain
