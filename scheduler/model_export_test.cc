#include "scheduler/model_export.h"

#include <filesystem>

#include "common/proto_json.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/model.pb.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/checkpoint_test_util.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "job-7";

// A store holding checkpoint v3 (step 30) of a 2-layer model.
class ModelExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
        CheckpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    for (int layer = 0; layer < 2; ++layer) {
      ASSERT_TRUE(
          store_->WriteLayer(kJob, 3, 30, 3, layer, TestLayerState(3, layer))
              .ok());
    }
    ASSERT_TRUE(store_->Commit(kJob, 3, 30, 2, kTestSpecJson, 3).ok());
    path_ = dir_.path() + "/model.safetensors";
  }

  // The model's parameters as initFrom would ask for them.
  static std::vector<ExpectedTensor> Expected() {
    return {{"layers.0.weight", {4, 2}},
            {"layers.0.bias", {4}},
            {"layers.1.weight", {4, 2}},
            {"layers.1.bias", {4}}};
  }

  ScopedTempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
  std::string path_;
};

TEST_F(ModelExportTest, HoldsParametersAndMetadata) {
  ASSERT_TRUE(store_->WriteExport(kJob, 3, path_).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensorsFile(path_, 1 << 20);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : file->tensors()) names.push_back(e.name);
  EXPECT_THAT(names, ElementsAre("layers.0.bias", "layers.0.weight",
                                 "layers.1.bias", "layers.1.weight"));
  const SafetensorsMetadata& m = file->metadata();
  EXPECT_EQ(m.at("format"), "pipetrain-export-v1");
  EXPECT_EQ(m.at("job_id"), kJob);
  EXPECT_EQ(m.at("step"), "30");
  EXPECT_EQ(m.at("version"), "3");
  EXPECT_EQ(m.at("training_spec"), kTestSpecJson);
  v1::ModelSpec model;
  ASSERT_TRUE(ParseJson(m.at("model_spec"), &model).ok());
  EXPECT_EQ(model.name(), "mlp");
  EXPECT_THAT(model.input_shape(), ElementsAre(4));
}

TEST_F(ModelExportTest, ReadsBackWhatTheCheckpointHeld) {
  ASSERT_TRUE(store_->WriteExport(kJob, 3, path_).ok());
  absl::StatusOr<ExportedModel> model =
      ReadModelExport(path_, Expected(), 1 << 20);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->info.step, 30);
  EXPECT_EQ(model->info.version, 3);
  EXPECT_EQ(model->info.job_id, kJob);
  ASSERT_EQ(model->tensors.size(), 4u);
  const std::vector<StateTensor> layer1 = TestLayerState(3, 1);
  EXPECT_EQ(model->tensors[2], layer1[0]);  // layers.1.weight
  EXPECT_EQ(model->tensors[3], layer1[1]);  // layers.1.bias
}

TEST_F(ModelExportTest, StreamedAndFileExportsAreTheSameBytes) {
  ASSERT_TRUE(store_->WriteExport(kJob, 3, path_).ok());
  std::string streamed;
  ASSERT_TRUE(store_
                  ->StreamExport(kJob, 3,
                                 [&](absl::string_view p) {
                                   streamed.append(p.data(), p.size());
                                   return absl::OkStatus();
                                 })
                  .ok());
  EXPECT_EQ(streamed, *ReadRegularFile(path_, 1 << 20));
}

TEST_F(ModelExportTest, MissingVersionWritesNothing) {
  const absl::Status s = store_->WriteExport(kJob, 4, path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("v4"));
  EXPECT_FALSE(std::filesystem::exists(path_));
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos)
        << e.path();
  }
}

TEST_F(ModelExportTest, RejectsAnotherModelSayingWhatDiffers) {
  ASSERT_TRUE(store_->WriteExport(kJob, 3, path_).ok());
  std::vector<ExpectedTensor> wider = Expected();
  wider[0].shape = {8, 2};
  absl::Status s = ReadModelExport(path_, wider, 1 << 20).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path_ + ": the file holds another model"));
  EXPECT_THAT(s.message(),
              HasSubstr("layers.0.weight is F32 [4, 2] but the model needs F32 "
                        "[8, 2]"));

  std::vector<ExpectedTensor> deeper = Expected();
  deeper.push_back({"layers.2.weight", {4, 4}});
  s = ReadModelExport(path_, deeper, 1 << 20).status();
  EXPECT_THAT(s.message(), HasSubstr("missing layers.2.weight"));

  std::vector<ExpectedTensor> shallower = Expected();
  shallower.resize(2);
  s = ReadModelExport(path_, shallower, 1 << 20).status();
  EXPECT_THAT(s.message(),
              HasSubstr("tensors the model does not have: layers.1.bias, "
                        "layers.1.weight"));
}

TEST_F(ModelExportTest, RejectsFilesThatAreNotExports) {
  // A checkpoint layer file: valid safetensors, not an export.
  const std::string layer_file = store_->LayerPath(kJob, 3, 0);
  absl::Status s = ReadModelExport(layer_file, Expected(), 1 << 20).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a pipetrain model export"));
  EXPECT_THAT(s.message(), HasSubstr(layer_file));

  ASSERT_TRUE(store_->WriteExport(kJob, 3, path_).ok());
  std::string bytes = *ReadRegularFile(path_, 1 << 20);
  bytes.resize(bytes.size() - 5);
  ASSERT_TRUE(WriteFileAtomically(path_, bytes).ok());
  s = ReadModelExport(path_, Expected(), 1 << 20).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path_ + ": safetensors: "));

  EXPECT_EQ(ReadModelExport(dir_.path() + "/none", Expected(), 1 << 20)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(StateTensorTest, NamesToLayers) {
  EXPECT_EQ(LayerOfStateTensor("layers.0.weight"), 0);
  EXPECT_EQ(LayerOfStateTensor("layers.12.attn.q.weight"), 12);
  EXPECT_EQ(LayerOfStateTensor("optimizer.layers.3.bias.m"), 3);
  for (const char* bad :
       {"layers.weight", "layers.1", "layers.1.", "layers..w", "layers.01.w",
        "layers.-1.w", "layers.+1.w", "optimizer.1.w", "x.layers.1.w",
        "layers.99999999999.w"}) {
    EXPECT_EQ(LayerOfStateTensor(bad), std::nullopt) << bad;
  }
  EXPECT_TRUE(IsParameterName("layers.0.weight"));
  EXPECT_FALSE(IsParameterName("optimizer.layers.0.weight.momentum"));
}

}  // namespace
}  // namespace pipetrain
