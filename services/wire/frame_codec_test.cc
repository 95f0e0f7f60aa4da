#include "services/wire/frame_codec.h"

#include <cstring>

#include "gtest/gtest.h"
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

StageMessage RoundTrip(const StageMessage& in, size_t chunk, int* frames) {
  auto encoded = EncodeMessage("job", in, chunk);
  EXPECT_TRUE(encoded.ok()) << encoded.status();
  *frames = static_cast<int>(encoded->size());
  FrameAssembler assembler;
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

TEST(FrameCodec, MessagesSurviveChunkingAcrossTensorBoundaries) {
  StageMessage in;
  in.kind = MessageKind::kActivation;
  in.step = 12;
  in.micro_batch = 3;
  in.weight_version = 7;
  // An odd-sized bf16 tensor forces an alignment gap before the labels.
  in.tensors = {Iota({5, 7}, DType::kBF16), Iota({5})};
  for (size_t chunk :
       {size_t{8}, size_t{24}, size_t{72}, size_t{1000}, kDefaultChunkBytes}) {
    int frames = 0;
    StageMessage out = RoundTrip(in, chunk, &frames);
    EXPECT_EQ(frames, static_cast<int>((92 + chunk - 1) / chunk)) << chunk;
    EXPECT_EQ(out.kind, in.kind);
    EXPECT_EQ(out.step, 12);
    EXPECT_EQ(out.micro_batch, 3);
    EXPECT_EQ(out.weight_version, 7);
    ASSERT_EQ(out.tensors.size(), 2u);
    EXPECT_EQ(out.tensors[0].dtype(), DType::kBF16);
    EXPECT_EQ(out.tensors[0].shape(), (Shape{5, 7}));
    EXPECT_EQ(std::memcmp(out.tensors[0].raw(), in.tensors[0].raw(), 70), 0);
    EXPECT_EQ(out.tensors[1].ToVector(), in.tensors[1].ToVector());
  }
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
  auto frames = EncodeMessage("job", in);
  ASSERT_TRUE(frames.ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE((*frames)[0].Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()), in.tensors[0].raw());
  // The frame keeps the tensor's storage alive.
  EXPECT_GE(in.tensors[0].storage().use_count(), 2);
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
  auto frames = EncodeMessage("job", in, 64);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 4u);
  EXPECT_EQ(assembler.Add((*frames)[1]).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(assembler.Add((*frames)[0]).ok());
  EXPECT_EQ(assembler.Add((*frames)[2]).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
