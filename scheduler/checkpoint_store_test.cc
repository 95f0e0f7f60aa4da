#include "scheduler/checkpoint_store.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/safetensors.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/checkpoint_test_util.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "job-1";

std::unique_ptr<CheckpointStore> OpenStore(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

// Writes every layer of `version` (step = 10 * version) and commits it.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(CheckpointStore& store,
                                               const std::string& job,
                                               int64_t version, int layers,
                                               int keep = 3) {
  for (int layer = 0; layer < layers; ++layer) {
    absl::Status s = store.WriteLayer(job, version, 10 * version, version,
                                      layer, TestLayerState(version, layer));
    if (!s.ok()) return s;
  }
  return store.Commit(job, version, 10 * version, layers, kTestSpecJson, keep);
}

std::vector<int64_t> Versions(CheckpointStore& store, const std::string& job) {
  absl::StatusOr<std::vector<CheckpointInfo>> listed = store.List(job);
  EXPECT_TRUE(listed.ok()) << listed.status();
  std::vector<int64_t> out;
  if (!listed.ok()) return out;
  for (const CheckpointInfo& i : *listed) out.push_back(i.version);
  return out;
}

TEST(CheckpointStoreTest, CommitsListsAndLoads) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*store, kJob, 2, 3);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->job_id, kJob);
  EXPECT_EQ(info->version, 2);
  EXPECT_EQ(info->step, 20);
  EXPECT_EQ(info->optimizer_steps, 2);
  EXPECT_EQ(info->num_layers, 3);
  EXPECT_GT(info->created_unix_ms, 0);
  int64_t on_disk = 0;
  for (int layer = 0; layer < 3; ++layer) {
    const std::string path = store->LayerPath(kJob, 2, layer);
    EXPECT_EQ(path, dir.path() + "/checkpoints/job-1/v2/layer-" +
                        std::to_string(layer) + ".safetensors");
    on_disk += static_cast<int64_t>(fs::file_size(path));
  }
  EXPECT_EQ(info->bytes, on_disk);

  EXPECT_THAT(Versions(*store, kJob), ElementsAre(2));
  EXPECT_EQ(store->Latest(kJob)->version, 2);
  absl::StatusOr<std::vector<StateTensor>> layer1 =
      store->LoadLayer(kJob, 2, 1);
  ASSERT_TRUE(layer1.ok()) << layer1.status();
  std::vector<StateTensor> expected1 = TestLayerState(2, 1);
  EXPECT_THAT(*layer1, testing::UnorderedElementsAreArray(expected1));

  absl::StatusOr<LoadedCheckpoint> all = store->Load(kJob, 2);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->spec_json, kTestSpecJson);
  ASSERT_EQ(all->tensors.size(), 9u);
  std::vector<int> layer_of;
  for (const StateTensor& t : all->tensors) {
    layer_of.push_back(LayerOfStateTensor(t.name).value_or(-1));
  }
  EXPECT_THAT(layer_of, ElementsAre(0, 0, 0, 1, 1, 1, 2, 2, 2));
}

TEST(CheckpointStoreTest, LayersWithoutStateAreWrittenEmpty) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store->WriteLayer(kJob, 1, 10, 1, 0, TestLayerState(1, 0)).ok());
  ASSERT_TRUE(store->WriteLayer(kJob, 1, 10, 1, 1, {}).ok());  // e.g. a ReLU
  ASSERT_TRUE(store->WriteLayer(kJob, 1, 10, 1, 2, TestLayerState(1, 2)).ok());
  ASSERT_TRUE(store->Commit(kJob, 1, 10, 3, "{}", 3).ok());
  absl::StatusOr<std::vector<StateTensor>> relu = store->LoadLayer(kJob, 1, 1);
  ASSERT_TRUE(relu.ok()) << relu.status();
  EXPECT_TRUE(relu->empty());
  EXPECT_EQ(store->Load(kJob, 1)->tensors.size(), 6u);
}

// Each layer file is a safetensors file any reader can open, with the
// checkpoint's numbers in its metadata.
TEST(CheckpointStoreTest, LayerFilesCarryTheirMetadata) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(WriteCheckpoint(*store, kJob, 5, 2).ok());
  absl::StatusOr<SafetensorsFile> file =
      ReadSafetensorsFile(store->LayerPath(kJob, 5, 1), 1 << 20);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("step"), "50");
  EXPECT_EQ(file->metadata().at("version"), "5");
  EXPECT_EQ(file->metadata().at("optimizer_steps"), "5");
  EXPECT_EQ(file->metadata().at("layer"), "1");
  EXPECT_EQ(file->metadata().at("job_id"), kJob);
  ASSERT_NE(file->Find("layers.1.weight"), nullptr);
  EXPECT_THAT(file->Find("layers.1.weight")->shape, ElementsAre(4, 2));
}

TEST(CheckpointStoreTest, IncompleteCheckpointIsNeverListedAndIsCleanedUp) {
  ScopedTempDir dir;
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(WriteCheckpoint(*store, kJob, 1, 3).ok());
    ASSERT_TRUE(
        store->WriteLayer(kJob, 2, 20, 2, 0, TestLayerState(2, 0)).ok());
    ASSERT_TRUE(
        store->WriteLayer(kJob, 2, 20, 2, 2, TestLayerState(2, 2)).ok());
    EXPECT_THAT(Versions(*store, kJob), ElementsAre(1));
    EXPECT_EQ(store->Load(kJob, 2).status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(store->LoadLayer(kJob, 2, 0).status().code(),
              absl::StatusCode::kNotFound);
    const absl::Status commit = store->Commit(kJob, 2, 20, 3, "{}", 3).status();
    EXPECT_EQ(commit.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(commit.message(), HasSubstr("2 of 3 layers landed; missing 1"));
    EXPECT_TRUE(fs::exists(store->LayerPath(kJob, 2, 0)));
  }
  // What a crash leaves: the uncommitted version and a temporary file.
  std::ofstream(dir.path() +
                "/checkpoints/job-1/v1/layer-0.safetensors.tmp-1-0")
      << "partial";
  fs::create_directories(dir.path() + "/checkpoints/job-9/v3");
  auto store = OpenStore(dir.path());
  EXPECT_FALSE(fs::exists(dir.path() + "/checkpoints/job-1/v2"));
  EXPECT_FALSE(fs::exists(dir.path() + "/checkpoints/job-9"));
  EXPECT_FALSE(fs::exists(dir.path() +
                          "/checkpoints/job-1/v1/layer-0.safetensors.tmp-1-0"));
  EXPECT_THAT(Versions(*store, kJob), ElementsAre(1));
  EXPECT_TRUE(store->Load(kJob, 1).ok());
  // The interrupted version can be written again from scratch.
  EXPECT_TRUE(WriteCheckpoint(*store, kJob, 2, 3).ok());
}

TEST(CheckpointStoreTest, RejectsInconsistentWritesAndCommits) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store->WriteLayer(kJob, 1, 10, 1, 0, TestLayerState(1, 0)).ok());
  // Another step for the same version.
  EXPECT_EQ(store->WriteLayer(kJob, 1, 11, 1, 1, TestLayerState(1, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  // A tensor of another layer.
  const absl::Status wrong_layer =
      store->WriteLayer(kJob, 1, 10, 1, 1, TestLayerState(1, 0));
  EXPECT_EQ(wrong_layer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_layer.message(), HasSubstr("does not belong to layer 1"));
  // Data that does not fill the shape.
  std::vector<StateTensor> short_data = TestLayerState(1, 1);
  short_data[0].data.resize(4);
  EXPECT_EQ(store->WriteLayer(kJob, 1, 10, 1, 1, short_data).code(),
            absl::StatusCode::kInvalidArgument);
  // Job ids that would escape the directory.
  EXPECT_EQ(store->WriteLayer("../x", 1, 10, 1, 0, {}).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(store->WriteLayer(kJob, 1, 10, 1, 1, TestLayerState(1, 1)).ok());
  EXPECT_EQ(store->Commit(kJob, 1, 12, 2, "{}", 3).status().code(),
            absl::StatusCode::kFailedPrecondition);  // wrong step
  const absl::Status extra = store->Commit(kJob, 1, 10, 1, "{}", 3).status();
  EXPECT_EQ(extra.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(extra.message(), HasSubstr("layer 1 was written but the model "
                                         "has 1 layers"));
  EXPECT_EQ(store->Commit(kJob, 1, 10, 2, "{}", 0).status().code(),
            absl::StatusCode::kInvalidArgument);  // keep 0
  ASSERT_TRUE(store->Commit(kJob, 1, 10, 2, "{}", 3).ok());
  EXPECT_EQ(store->Commit(kJob, 1, 10, 2, "{}", 3).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->WriteLayer(kJob, 1, 10, 1, 0, TestLayerState(1, 0)).code(),
            absl::StatusCode::kFailedPrecondition);  // committed: immutable
  EXPECT_EQ(store->Commit(kJob, 7, 70, 2, "{}", 3).status().code(),
            absl::StatusCode::kFailedPrecondition);  // nothing written
  EXPECT_EQ(store->Latest("job-2").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointStoreTest, KeepsTheNewestCheckpoints) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  for (int64_t v = 1; v <= 5; ++v) {
    ASSERT_TRUE(WriteCheckpoint(*store, kJob, v, 2, /*keep=*/2).ok());
  }
  EXPECT_THAT(Versions(*store, kJob), ElementsAre(5, 4));
  for (int64_t v = 1; v <= 3; ++v) {
    EXPECT_FALSE(
        fs::exists(dir.path() + "/checkpoints/job-1/v" + std::to_string(v)));
    EXPECT_EQ(store->Load(kJob, v).status().code(),
              absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(store->Load(kJob, 4).ok());
}

TEST(CheckpointStoreTest, DetectsDamagedFiles) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(WriteCheckpoint(*store, kJob, 1, 3).ok());
  const std::string flipped = store->LayerPath(kJob, 1, 0);
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  absl::Status s = store->Load(kJob, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(flipped));
  EXPECT_THAT(s.message(), HasSubstr("checksum"));

  const std::string truncated = store->LayerPath(kJob, 1, 1);
  fs::resize_file(truncated, fs::file_size(truncated) - 1);
  s = store->LoadLayer(kJob, 1, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(truncated));

  const std::string missing = store->LayerPath(kJob, 1, 2);
  fs::remove(missing);
  s = store->LoadLayer(kJob, 1, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(missing));
  EXPECT_EQ(store->LoadLayer(kJob, 1, 3).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointStoreTest, SurvivesReopening) {
  ScopedTempDir dir;
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(WriteCheckpoint(*store, kJob, 3, 2).ok());
    ASSERT_TRUE(WriteCheckpoint(*store, "job-2", 1, 1).ok());
  }
  auto store = OpenStore(dir.path());
  EXPECT_THAT(Versions(*store, kJob), ElementsAre(3));
  EXPECT_THAT(Versions(*store, "job-2"), ElementsAre(1));
  absl::StatusOr<std::vector<StateTensor>> layer = store->LoadLayer(kJob, 3, 1);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_THAT(*layer, testing::UnorderedElementsAreArray(TestLayerState(3, 1)));
}

TEST(CheckpointStoreTest, DiscardAndDeleteJob) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(WriteCheckpoint(*store, kJob, 1, 2).ok());
  ASSERT_TRUE(store->WriteLayer(kJob, 2, 20, 2, 0, TestLayerState(2, 0)).ok());
  ASSERT_TRUE(store->Discard(kJob, 2).ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/checkpoints/job-1/v2"));
  EXPECT_EQ(store->Commit(kJob, 2, 20, 1, "{}", 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Discard(kJob, 1).code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(WriteCheckpoint(*store, "job-2", 1, 1).ok());
  ASSERT_TRUE(store->DeleteJob(kJob).ok());
  EXPECT_TRUE(store->List(kJob)->empty());
  EXPECT_FALSE(fs::exists(dir.path() + "/checkpoints/job-1"));
  EXPECT_THAT(Versions(*store, "job-2"), ElementsAre(1));
  EXPECT_TRUE(store->Load("job-2", 1).ok());
}

// Layers land from several threads at once (one per stage stream) while
// readers load whatever is listed and retention removes old versions: a
// listed checkpoint loads intact or is gone (NotFound), never damaged.
TEST(CheckpointStoreTest, ConcurrentWritersReadersAndRetention) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  constexpr int kLayers = 4;
  std::atomic<bool> done{false};
  std::atomic<int> loads{0};
  std::thread reader([&] {
    while (!done.load()) {
      absl::StatusOr<std::vector<CheckpointInfo>> all = store->List(kJob);
      ASSERT_TRUE(all.ok());
      for (const CheckpointInfo& info : *all) {
        absl::StatusOr<LoadedCheckpoint> c = store->Load(kJob, info.version);
        if (c.ok()) {
          ++loads;
          EXPECT_EQ(c->tensors.size(), 3u * kLayers);
          // Layer 0's bias comes first (a file orders tensors by name).
          EXPECT_EQ(c->tensors[0].data,
                    TestLayerState(info.version, 0, 32)[1].data);
        } else {
          EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound)
              << c.status();
        }
      }
    }
  });
  for (int64_t v = 1; v <= 12; ++v) {
    std::vector<std::thread> writers;
    for (int layer = 0; layer < kLayers; ++layer) {
      writers.emplace_back([&, layer] {
        EXPECT_TRUE(store
                        ->WriteLayer(kJob, v, 10 * v, v, layer,
                                     TestLayerState(v, layer, 32))
                        .ok());
      });
    }
    for (std::thread& t : writers) t.join();
    ASSERT_TRUE(store->Commit(kJob, v, 10 * v, kLayers, "{}", 2).ok());
  }
  done = true;
  reader.join();
  EXPECT_THAT(Versions(*store, kJob), ElementsAre(12, 11));
  EXPECT_GT(loads.load(), 0);
}

}  // namespace
}  // namespace pipetrain
