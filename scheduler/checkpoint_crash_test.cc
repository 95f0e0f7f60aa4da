// Crash consistency of the checkpoint store: a child process writes and
// commits checkpoints in a loop (resuming after the newest one, as a
// restarted scheduler would) and is SIGKILLed at a random moment, 60
// times, seeded. After every kill the store is reopened, and:
//   - it lists at most `keep` checkpoints, each of which loads with its
//     checksums verified and holds exactly the values that were written;
//   - the newest committed version never goes backwards (a commit that
//     returned stays committed);
//   - the files on disk are exactly the listed checkpoints' layer files
//     (what the crash left half-written was removed).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "common/temp_dir_for_test.h"
#include "gtest/gtest.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/checkpoint_test_util.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

constexpr char kJob[] = "job-crash";
constexpr int kTrials = 60;
constexpr int kLayers = 4;
constexpr int kKeep = 3;
constexpr int64_t kWidth = 96;  // ~74 KB per layer file

// Exit codes of a child that failed instead of being killed.
enum ChildExit { kOpenFailed = 2, kWriteFailed = 3, kCommitFailed = 4 };

// Runs until killed. Every few versions it abandons one half-written
// (Discard, or nothing at all) as a failed checkpoint would.
// Writes one byte to `ready_fd` once the store is open, so the parent's
// random delay counts from when writing starts, however slow the start.
[[noreturn]] void WriterChild(const std::string& dir, uint32_t seed,
                              int ready_fd) {
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(dir);
  if (!store.ok()) _exit(kOpenFailed);
  const char ready = 1;
  if (write(ready_fd, &ready, 1) != 1) _exit(kOpenFailed);
  absl::StatusOr<CheckpointInfo> latest = (*store)->Latest(kJob);
  std::mt19937 rng(seed);
  for (int64_t v = latest.ok() ? latest->version + 1 : 1;; ++v) {
    const bool abandon = rng() % 5 == 0;
    const int layers =
        abandon ? 1 + static_cast<int>(rng() % kLayers) : kLayers;
    for (int layer = 0; layer < layers; ++layer) {
      if (!(*store)
               ->WriteLayer(kJob, v, 10 * v, v, layer,
                            TestLayerState(v, layer, kWidth))
               .ok()) {
        _exit(kWriteFailed);
      }
    }
    if (abandon) {
      if (rng() % 2 == 0) (void)(*store)->Discard(kJob, v);
      continue;
    }
    if (!(*store)
             ->Commit(kJob, v, 10 * v, kLayers, kTestSpecJson, kKeep)
             .ok()) {
      _exit(kCommitFailed);
    }
  }
}

// Every regular file under checkpoints/ but the catalog's.
std::set<std::string> LayerFilesOnDisk(const std::string& root) {
  std::set<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    if (absl::StartsWith(e.path().filename().string(), "catalog.db")) continue;
    files.insert(e.path().string());
  }
  return files;
}

// Checks the reopened store; returns its newest version (0 when none).
int64_t CheckReopenedStore(const std::string& dir, int trial) {
  absl::StatusOr<std::unique_ptr<CheckpointStore>> opened =
      CheckpointStore::Open(dir);
  EXPECT_TRUE(opened.ok()) << "trial " << trial << ": " << opened.status();
  if (!opened.ok()) return -1;
  CheckpointStore& store = **opened;
  absl::StatusOr<std::vector<CheckpointInfo>> listed = store.List(kJob);
  EXPECT_TRUE(listed.ok()) << listed.status();
  if (!listed.ok()) return -1;
  EXPECT_LE(listed->size(), static_cast<size_t>(kKeep)) << "trial " << trial;
  std::set<std::string> expected_files;
  for (const CheckpointInfo& info : *listed) {
    EXPECT_EQ(info.step, 10 * info.version);
    EXPECT_EQ(info.num_layers, kLayers);
    absl::StatusOr<LoadedCheckpoint> loaded = store.Load(kJob, info.version);
    EXPECT_TRUE(loaded.ok()) << "trial " << trial << ": " << loaded.status();
    if (!loaded.ok()) continue;
    std::map<std::string, StateTensor> by_name;
    for (StateTensor& t : loaded->tensors) by_name[t.name] = std::move(t);
    EXPECT_EQ(by_name.size(), 3u * kLayers);
    for (int layer = 0; layer < kLayers; ++layer) {
      expected_files.insert(store.LayerPath(kJob, info.version, layer));
      for (const StateTensor& t : TestLayerState(info.version, layer, kWidth)) {
        EXPECT_TRUE(by_name.count(t.name) && by_name[t.name] == t)
            << "trial " << trial << ": v" << info.version << " " << t.name;
      }
    }
  }
  EXPECT_EQ(LayerFilesOnDisk(store.root()), expected_files)
      << "trial " << trial;
  return listed->empty() ? 0 : listed->front().version;
}

// Seconds one checkpoint takes on this disk (fsync dominates), so that the
// kills spread over a few checkpoints whatever the machine.
double SecondsPerCheckpoint(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return 0.01;
  const auto start = std::chrono::steady_clock::now();
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_TRUE((*store)
                    ->WriteLayer(kJob, 1, 10, 1, layer,
                                 TestLayerState(1, layer, kWidth))
                    .ok());
  }
  EXPECT_TRUE(
      (*store)->Commit(kJob, 1, 10, kLayers, kTestSpecJson, kKeep).ok());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(CheckpointCrashTest, KilledWritersLeaveOnlyCompleteCheckpoints) {
  ScopedTempDir dir;
  ScopedTempDir scratch;
  const double per_checkpoint = SecondsPerCheckpoint(scratch.path());
  // Up to ~2.5 checkpoints' time (the child also opens the store), capped
  // so the test stays short on a slow disk.
  const int max_delay_us =
      static_cast<int>(std::clamp(2.5e6 * per_checkpoint, 5000.0, 400000.0));
  std::mt19937 rng(20261123);
  std::uniform_real_distribution<double> delay_fraction(0.0, 1.0);
  // A busy machine slows the writer: a trial that saw no progress stretches
  // the delays of the next ones (up to 8x), one that did shrinks them back.
  double stretch = 1.0;
  int64_t newest = 0;
  int advanced = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const uint32_t seed = rng();
    const int wait_us =
        static_cast<int>(delay_fraction(rng) * max_delay_us * stretch);
    int ready_pipe[2];
    ASSERT_EQ(pipe(ready_pipe), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(ready_pipe[0]);
      WriterChild(dir.path(), seed, ready_pipe[1]);
    }
    close(ready_pipe[1]);
    char ready = 0;
    ASSERT_EQ(read(ready_pipe[0], &ready, 1), 1)
        << "trial " << trial << ": the writer could not open the store";
    close(ready_pipe[0]);
    usleep(static_cast<useconds_t>(wait_us));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "trial " << trial << ": the writer exited by itself with "
        << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    const int64_t now = CheckReopenedStore(dir.path(), trial);
    ASSERT_GE(now, newest) << "trial " << trial
                           << ": a committed checkpoint was lost";
    if (now > newest) {
      ++advanced;
      stretch = std::max(1.0, stretch / 1.25);
    } else {
      stretch = std::min(8.0, stretch * 1.25);
    }
    newest = now;
  }
  // The kills must land while the writer makes progress, not only before
  // it starts; otherwise the test proves nothing.
  EXPECT_GE(advanced, kTrials / 6);
  std::printf(
      "checkpoint crash test: %d trials, kills within %d us (one checkpoint "
      "takes %.1f ms), newest v%lld, %d trials advanced it\n",
      kTrials, max_delay_us, 1e3 * per_checkpoint,
      static_cast<long long>(newest), advanced);
}

}  // namespace
}  // namespace pipetrain
