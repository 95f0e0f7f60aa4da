// A stage's state as StateChunks: cut into chunks of bounded size and put
// back together unchanged; every malformed stream is refused with
// InvalidArgument naming the tensor, and other layers' tensors are skipped.
#include "worker/pipeline/state_stream.h"

#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/test_model_specs.h"
#include "worker/compute/cpu/cpu_backend.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

class StateStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const v1::ModelSpec spec = test_specs::Parse(test_specs::kMlp);
    v1::OptimizerSpec opt;
    opt.mutable_adamw()->set_lr(0.01f);
    auto whole = Model::Build(spec, 0, spec.layers_size(), backend_.get(), 3);
    auto tail = Model::Build(spec, 4, spec.layers_size(), backend_.get(), 3);
    auto optimizer = Optimizer::Create(opt, backend_.get());
    ASSERT_TRUE(whole.ok() && tail.ok() && optimizer.ok());
    whole_ = std::move(*whole);
    tail_ = std::move(*tail);
    optimizer_ = std::move(*optimizer);
    auto state =
        ExportTrainingState({whole_.get()}, *optimizer_, backend_.get());
    ASSERT_TRUE(state.ok()) << state.status();
    snapshot_ = std::make_shared<StageStateSnapshot>();
    snapshot_->step = 7;
    snapshot_->weight_version = 7;
    snapshot_->state = std::move(*state);
    snapshot_->state.optimizer_steps = 7;
  }

  // The whole model's state as chunks of at most `max_bytes`.
  std::vector<v1::StateChunk> Chunks(size_t max_bytes) {
    StateChunker chunker("job", snapshot_, max_bytes);
    std::vector<v1::StateChunk> out;
    v1::StateChunk chunk;
    while (chunker.Next(&chunk)) out.push_back(chunk);
    return out;
  }

  StateLayout TailLayout() const {
    return StateLayout::Of({tail_.get()}, *optimizer_);
  }

  // Feeds `chunks` to an assembler for the model's layers [4, 8).
  absl::StatusOr<TrainingState> Assemble(
      const std::vector<v1::StateChunk>& chunks) {
    StateAssembler assembler("job", TailLayout());
    for (const v1::StateChunk& c : chunks) {
      absl::Status status = assembler.Add(c);
      if (!status.ok()) return status;
    }
    return assembler.Finish();
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
  std::unique_ptr<Model> whole_;
  std::unique_ptr<Model> tail_;
  std::unique_ptr<Optimizer> optimizer_;
  std::shared_ptr<StageStateSnapshot> snapshot_;
};

TEST_F(StateStreamTest, ChunksCarryEveryByteAndReassemble) {
  const std::vector<v1::StateChunk> chunks = Chunks(100);
  int64_t bytes = 0;
  for (const v1::StateChunk& c : chunks) {
    EXPECT_LE(c.data().size(), 100u);
    EXPECT_EQ(c.job_id(), "job");
    EXPECT_EQ(c.step(), 7);
    EXPECT_EQ(c.optimizer_steps(), 7);
    bytes += static_cast<int64_t>(c.data().size());
  }
  int64_t want = 0;
  for (const auto& [name, t] : snapshot_->state.tensors) want += t.bytes();
  EXPECT_EQ(bytes, want);
  // The default size: one chunk per tensor here (all below 1 MiB).
  EXPECT_EQ(Chunks(kStateChunkBytes).size(), snapshot_->state.tensors.size());

  auto got = Assemble(chunks);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->optimizer_steps, 7);
  // Only the tail's tensors (layers 4 and 7 with their slots) are kept.
  EXPECT_EQ(got->tensors.size(), TailLayout().tensors().size());
  for (const auto& [name, tensor] : got->tensors) {
    EXPECT_EQ(tensor.ToVector(), snapshot_->state.tensors.at(name).ToVector())
        << name;
  }
  EXPECT_EQ(got->tensors.count("layers.1.weight"), 0u);
}

TEST_F(StateStreamTest, MalformedStreamsAreRefused) {
  const std::vector<v1::StateChunk> good = Chunks(100);
  // The first chunk of layers.4.weight (a tensor the tail keeps).
  size_t w4 = 0;
  while (good[w4].name() != "layers.4.weight") ++w4;
  struct Case {
    std::string what;
    std::string message;
    std::function<void(std::vector<v1::StateChunk>*)> edit;
  };
  const std::vector<Case> cases = {
      {"gap in the offsets", "expected offset 100",
       [w4](auto* c) { (*c)[w4 + 1].set_offset(104); }},
      {"past total_bytes", "outside its total_bytes",
       [w4](auto* c) { (*c)[w4].set_offset((*c)[w4].total_bytes() - 10); }},
      {"cut short", "ended after 100 of its",
       [w4](auto* c) { c->erase(c->begin() + w4 + 1, c->begin() + w4 + 4); }},
      {"wrong dtype", "DTYPE_F16",
       [w4](auto* c) { (*c)[w4].set_dtype(v1::DTYPE_F16); }},
      {"wrong shape", "the stage's is [8, 12]",
       [w4](auto* c) {
         (*c)[w4].clear_shape();
         (*c)[w4].add_shape(12);
         (*c)[w4].add_shape(8);
         (*c)[w4].add_shape(1);
       }},
      {"total over the tensor", "its shape needs 384",
       [w4](auto* c) {
         for (size_t i = w4; (*c)[i].name() == "layers.4.weight"; ++i) {
           (*c)[i].set_total_bytes(1 << 30);
         }
       }},
      {"twice", "comes twice",
       [w4](auto* c) {
         std::vector<v1::StateChunk> again;
         for (size_t i = w4; (*c)[i].name() == "layers.4.weight"; ++i) {
           again.push_back((*c)[i]);
         }
         c->insert(c->end(), again.begin(), again.end());
       }},
      {"another job", "in a stream for job 'job'",
       [w4](auto* c) { (*c)[w4].set_job_id("other"); }},
      {"another step", "differ from the stream's",
       [w4](auto* c) { (*c)[w4].set_step(3); }},
      {"unknown tensor", "layer 4 has no parameter 'gamma'",
       [w4](auto* c) { (*c)[w4].set_name("layers.4.gamma"); }},
      {"bad name", "state tensor 'weights'",
       [](auto* c) { (*c)[0].set_name("weights"); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<v1::StateChunk> chunks = good;
    c.edit(&chunks);
    const absl::Status status = Assemble(chunks).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

// Tensors of layers the stage does not hold are skipped whatever they
// claim to be (no shape check, nothing kept); their byte ranges must still
// add up.
TEST_F(StateStreamTest, OtherLayersAreSkipped) {
  std::vector<v1::StateChunk> chunks = Chunks(100);
  v1::StateChunk odd = chunks.front();
  odd.set_name("layers.1.unheard_of");
  odd.clear_shape();
  odd.add_shape(3);
  chunks.insert(chunks.begin(), odd);
  auto got = Assemble(chunks);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensors.size(), TailLayout().tensors().size());
  chunks.front().set_offset(8);
  EXPECT_EQ(Assemble(chunks).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
