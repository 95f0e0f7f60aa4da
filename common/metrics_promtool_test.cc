// Checks the rendered exposition text with Prometheus' own parser and linter
// (`promtool check metrics`). deploy/setup.sh installs promtool (Debian
// package `prometheus`), so a missing promtool is a failure, not a skip.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "common/metrics_registry.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Runs `command` through the shell; returns its exit status (or -1) and
// stores its combined output in `output`.
int RunShell(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
}

// A registry with every kind of family, labels that need escaping and the
// special values.
void FillSampleRegistry(MetricsRegistry* registry) {
  const char* bytes_help = "Bytes sent and received per edge.";
  (*registry->GetCounter("pipetrain_stage_bytes_total", bytes_help,
                         {{"stage", "0"}, {"direction", "sent"}}))
      ->Increment(1 << 20);
  (*registry->GetCounter("pipetrain_stage_bytes_total", bytes_help,
                         {{"stage", "1"}, {"direction", "received"}}))
      ->Increment(4096);
  (*registry->GetGauge("pipetrain_stage_weight_version",
                       "Weight version in use.", {{"stage", "0"}}))
      ->Set(7);
  (*registry->GetGauge("pipetrain_loss", "Last training loss."))->Set(NAN);
  (*registry->GetCounter("pipetrain_odd_labels_total",
                         "Label values with \\ \" and\nnewlines.",
                         {{"path", "a\\b \"c\"\nd"}}))
      ->Increment();
  Histogram* compute = *registry->GetHistogram(
      "pipetrain_stage_compute_seconds", "Compute time by phase.",
      ExponentialBuckets(0.001, 4, 6), {{"phase", "forward"}});
  for (double v : {0.0005, 0.02, 0.3, 12.0}) compute->Observe(v);
  (void)registry->AddCallbackGauge(
      "pipetrain_scheduler_workers", "Workers by state.", {"state"}, [] {
        return std::vector<GaugeSample>{{{"idle"}, 1}, {{"running"}, 4}};
      });
}

// Lints `text` with promtool; returns its exit status and output.
int PromtoolCheck(const std::string& text, std::string* output) {
  const char* tmpdir = getenv("TMPDIR");
  std::string path = std::string(tmpdir != nullptr ? tmpdir : "/tmp") +
                     "/pipetrain_metrics_XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) return -1;
  const bool written =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  const int rc =
      written ? RunShell("promtool check metrics < '" + path + "'", output)
              : -1;
  unlink(path.c_str());
  return rc;
}

class MetricsPromtool : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string which;
    ASSERT_EQ(RunShell("command -v promtool", &which), 0)
        << "promtool not found; run deploy/setup.sh (Debian package "
           "`prometheus`)";
  }
};

TEST_F(MetricsPromtool, RenderedTextPassesPromtoolCheckMetrics) {
  MetricsRegistry registry;
  FillSampleRegistry(&registry);
  const std::string text = registry.RenderText();
  std::string output;
  EXPECT_EQ(PromtoolCheck(text, &output), 0) << "promtool output:\n"
                                             << output << "\ninput:\n"
                                             << text;
}

// Guards the check above against passing vacuously: promtool does reject a
// counter without the _total suffix.
TEST_F(MetricsPromtool, PromtoolRejectsCounterWithoutTotalSuffix) {
  MetricsRegistry registry;
  (*registry.GetCounter("pipetrain_requests", "Requests."))->Increment();
  std::string output;
  EXPECT_NE(PromtoolCheck(registry.RenderText(), &output), 0) << output;
}

}  // namespace
}  // namespace pipetrain
