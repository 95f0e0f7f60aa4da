// For the network lab's gtest tests: skip when PIPETRAIN_SKIP_NETNS=1,
// fail saying what is missing when the lab cannot be built.
#ifndef PIPETRAIN_TESTS_NETLAB_REQUIRE_LAB_H_
#define PIPETRAIN_TESTS_NETLAB_REQUIRE_LAB_H_

#include "gtest/gtest.h"
#include "tests/netlab/netlab.h"

#define PIPETRAIN_REQUIRE_LAB()                                           \
  do {                                                                    \
    if (::pipetrain::netlab::SkipRequested()) {                           \
      GTEST_SKIP() << "PIPETRAIN_SKIP_NETNS=1: network lab test skipped"; \
    }                                                                     \
    const absl::Status lab_ready =                                        \
        ::pipetrain::netlab::CheckLabPrerequisites();                     \
    ASSERT_TRUE(lab_ready.ok()) << lab_ready;                             \
  } while (0)

#endif  // PIPETRAIN_TESTS_NETLAB_REQUIRE_LAB_H_
