// ScopedTempDir: a fresh directory under /tmp for a test, removed with
// everything in it when the object goes. Test-only; not thread-safe.
#ifndef PIPETRAIN_COMMON_TEMP_DIR_FOR_TEST_H_
#define PIPETRAIN_COMMON_TEMP_DIR_FOR_TEST_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {

class ScopedTempDir {
 public:
  ScopedTempDir() {
    char name[] = "/tmp/pipetrain_test_XXXXXX";  // mkdtemp's template
    const char* made = mkdtemp(name);
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    if (made != nullptr) path_ = made;
  }
  ~ScopedTempDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TEMP_DIR_FOR_TEST_H_
