#include "scheduler/state_chunks.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

StateTensor Tensor(const std::string& name, std::vector<int64_t> shape) {
  StateTensor t;
  t.name = name;
  t.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i) * 0.5f - 3.0f;
    t.data.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  return t;
}

TEST(StateChunksTest, TensorsSurviveTheRoundTripWhateverTheChunkSize) {
  const std::vector<StateTensor> sent = {
      Tensor("layers.0.weight", {7, 5}), Tensor("layers.0.bias", {7}),
      Tensor("optimizer.layers.0.weight.m", {7, 5}),
      Tensor("layers.1.weight", {0, 3})};
  for (size_t chunk : {size_t{4}, size_t{12}, size_t{1000}}) {
    std::vector<StateTensor> got;
    StageStateInfo info_seen;
    StateChunkAssembler assembler(
        [&](const StageStateInfo& info, StateTensor t) {
          info_seen = info;
          got.push_back(std::move(t));
          return absl::OkStatus();
        });
    for (const StateTensor& t : sent) {
      for (const v1::StateChunk& c : ChunksOf("job-1", {8, 9, 10}, t, chunk)) {
        ASSERT_TRUE(assembler.Add(c).ok());
      }
    }
    ASSERT_TRUE(assembler.Finish().ok());
    ASSERT_EQ(got.size(), sent.size()) << "chunk " << chunk;
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(got[i].name, sent[i].name);
      EXPECT_EQ(got[i].shape, sent[i].shape);
      EXPECT_EQ(got[i].data, sent[i].data);
    }
    EXPECT_EQ(info_seen.step, 8);
    EXPECT_EQ(info_seen.weight_version, 9);
    EXPECT_EQ(info_seen.optimizer_steps, 10);
    EXPECT_EQ(assembler.tensors(), 4);
  }
}

TEST(StateChunksTest, BrokenStreamsAreRejectedWithTheTensorNamed) {
  const StateTensor t = Tensor("layers.2.weight", {4, 4});
  const std::vector<v1::StateChunk> chunks = ChunksOf("j", {}, t, 16);
  ASSERT_EQ(chunks.size(), 4u);
  auto sink = [](const StageStateInfo&, StateTensor) {
    return absl::OkStatus();
  };
  {  // a chunk skipped
    StateChunkAssembler a(sink);
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    const absl::Status s = a.Add(chunks[2]);
    EXPECT_TRUE(absl::IsInvalidArgument(s));
    EXPECT_THAT(s.message(), HasSubstr("layers.2.weight"));
  }
  {  // the stream ends inside the tensor
    StateChunkAssembler a(sink);
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    EXPECT_THAT(a.Finish().message(), HasSubstr("16 of 64 bytes"));
  }
  {  // a size that does not match the shape
    v1::StateChunk bad = chunks[0];
    bad.add_shape(2);
    StateChunkAssembler a(sink);
    EXPECT_THAT(a.Add(bad).message(), HasSubstr("does not match its shape"));
  }
  {  // not F32
    v1::StateChunk bad = chunks[0];
    bad.set_dtype(v1::DTYPE_BF16);
    StateChunkAssembler a(sink);
    EXPECT_TRUE(absl::IsInvalidArgument(a.Add(bad)));
  }
  {  // the sink's error ends the stream
    StateChunkAssembler a([](const StageStateInfo&, StateTensor) {
      return absl::DataLossError("disk full");
    });
    absl::Status s;
    for (const v1::StateChunk& c : chunks) s.Update(a.Add(c));
    EXPECT_TRUE(absl::IsDataLoss(s));
  }
}

}  // namespace
}  // namespace pipetrain
