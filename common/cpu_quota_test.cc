#include "common/cpu_quota.h"

#include <map>
#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A host whose cpu controller is on cgroup v1 beside a v2 hierarchy
// without it (Debian 11 style hybrid), as /proc/self/mountinfo lists them.
constexpr char kHybridMounts[] =
    "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 "
    "cgroup2 rw,nsdelegate\n"
    "30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:11 - cgroup "
    "cgroup rw,cpu,cpuacct\n"
    "31 25 0:28 / /sys/fs/cgroup/cpuset rw shared:12 - cgroup cgroup "
    "rw,cpuset\n";
constexpr char kHybridSelf[] =
    "12:cpuset:/\n"
    "4:cpu,cpuacct:/jobs/w1\n"
    "0::/jobs/w1\n";

constexpr char kV2Mounts[] =
    "22 1 0:21 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";

class Files {
 public:
  Files& Set(const std::string& path, const std::string& text) {
    files_[path] = text;
    return *this;
  }
  // A cgroup v1 directory under the hybrid host's cpu hierarchy with a CFS
  // quota (-1: none) over a 100 ms period.
  Files& V1(const std::string& dir, const std::string& quota) {
    const std::string at = "/sys/fs/cgroup/cpu,cpuacct" + dir;
    return Set(at + "/cpu.cfs_quota_us", quota + "\n")
        .Set(at + "/cpu.cfs_period_us", "100000\n");
  }
  FileReader Reader() const {
    return [this](const std::string& path) -> std::optional<std::string> {
      auto it = files_.find(path);
      if (it == files_.end()) return std::nullopt;
      return it->second;
    };
  }

 private:
  std::map<std::string, std::string> files_;
};

TEST(CgroupCpuLimitTest, ReadsTheV1QuotaOfTheProcessCgroup) {
  Files files;
  files.V1("/jobs/w1", "33000").V1("/jobs", "-1").V1("", "-1");
  std::optional<double> limit =
      CgroupCpuLimitFrom(kHybridMounts, kHybridSelf, files.Reader());
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(*limit, 0.33);
}

TEST(CgroupCpuLimitTest, AnAncestorsLowerLimitWins) {
  // Kubernetes caps the pod and the container: the tighter one holds.
  Files files;
  files.V1("/jobs/w1", "200000").V1("/jobs", "50000");
  std::optional<double> limit =
      CgroupCpuLimitFrom(kHybridMounts, kHybridSelf, files.Reader());
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(*limit, 0.5);
}

TEST(CgroupCpuLimitTest, NoQuotaAnywhereIsNoLimit) {
  Files files;
  files.V1("/jobs/w1", "-1");
  EXPECT_FALSE(CgroupCpuLimitFrom(kHybridMounts, kHybridSelf, files.Reader()));
  EXPECT_FALSE(
      CgroupCpuLimitFrom(kHybridMounts, kHybridSelf, Files().Reader()));
}

TEST(CgroupCpuLimitTest, ReadsCpuMaxOnAV2OnlyHost) {
  Files files;
  files.Set("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "150000 100000\n")
      .Set("/sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n")
      .Set("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  std::optional<double> limit =
      CgroupCpuLimitFrom(kV2Mounts, "0::/kubepods/pod1/c1\n", files.Reader());
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(*limit, 1.5);

  Files unlimited;
  unlimited.Set("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n");
  EXPECT_FALSE(CgroupCpuLimitFrom(kV2Mounts, "0::/kubepods/pod1/c1\n",
                                  unlimited.Reader()));
}

TEST(CgroupCpuLimitTest, InAContainerTheMountShowsItsOwnCgroupAsRoot) {
  // Docker with a private cgroup namespace off: the mount's root is the
  // container's cgroup, and the process's path is the full one.
  const std::string mounts =
      "700 690 0:21 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 "
      "rw\n";
  Files files;
  files.Set("/sys/fs/cgroup/cpu.max", "50000 100000\n");
  std::optional<double> limit =
      CgroupCpuLimitFrom(mounts, "0::/docker/abc\n", files.Reader());
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(*limit, 0.5);
  // A path outside the mount's root: only the root is read.
  limit = CgroupCpuLimitFrom(mounts, "0::/elsewhere\n", files.Reader());
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(*limit, 0.5);
}

TEST(CgroupCpuLimitTest, MalformedFilesAreNoLimit) {
  Files files;
  files.Set("/sys/fs/cgroup/a/cpu.max", "lots\n")
      .Set("/sys/fs/cgroup/cpu.max", "0 100000\n");
  EXPECT_FALSE(CgroupCpuLimitFrom(kV2Mounts, "0::/a\n", files.Reader()));
  EXPECT_FALSE(CgroupCpuLimitFrom("garbage\n", "0::/a\n", files.Reader()));
  EXPECT_FALSE(CgroupCpuLimitFrom(kV2Mounts, "", files.Reader()));
}

TEST(CpuShareOfTest, IsTheLimitOverTheThreadsAtMostOne) {
  EXPECT_DOUBLE_EQ(CpuShareOf(std::nullopt, 2), 1.0);
  EXPECT_DOUBLE_EQ(CpuShareOf(0.33, 1), 0.33);
  EXPECT_DOUBLE_EQ(CpuShareOf(1.5, 2), 0.75);
  EXPECT_DOUBLE_EQ(CpuShareOf(4.0, 2), 1.0);
}

}  // namespace
}  // namespace pipetrain
