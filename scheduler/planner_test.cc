#include "scheduler/planner.h"
#include "gtest/gtest.h"
TEST(Placeholder, Builds) {}
