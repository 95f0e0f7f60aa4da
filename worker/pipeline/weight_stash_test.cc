#include "worker/pipeline/weight_stash.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"

namespace pipetrain {
namespace {

// Two parameters whose every element is `value`.
void Fill(std::vector<Param>* params, float value) {
  for (Param& p : *params) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.f32()[i] = value;
  }
}

std::vector<float> Values(const std::vector<Param>& params) {
  std::vector<float> out;
  for (const Param& p : params) {
    const std::vector<float> v = p.value.ToVector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

class WeightStashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const Shape& shape : {Shape{3, 4}, Shape{4}}) {
      Param p;
      p.value = Tensor::Host(shape);
      params_.push_back(p);
    }
  }
  std::vector<Param*> Pointers() {
    std::vector<Param*> out;
    for (Param& p : params_) out.push_back(&p);
    return out;
  }
  // Version 0 (all ones) pinned by a forward and stashed; the live
  // weights then move on to version 1 (all twos).
  void PinAndUpdateVersion0(WeightStash* stash) {
    Fill(&params_, 1.0f);
    stash->Pin(0);
    ASSERT_TRUE(stash->BeforeUpdate(0).ok());
    Fill(&params_, 2.0f);
  }
  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
  std::vector<Param> params_;
};

TEST_F(WeightStashTest, AForwardsVersionComesBackForItsBackward) {
  WeightStash stash(backend_.get(), Pointers());
  PinAndUpdateVersion0(&stash);
  EXPECT_EQ(stash.depth(), 1);
  {
    StashedWeights use(&stash);
    ASSERT_TRUE(use.Use(0, 1).ok());
    EXPECT_EQ(Values(params_), std::vector<float>(16, 1.0f));
  }
  EXPECT_EQ(Values(params_), std::vector<float>(16, 2.0f));
  stash.Unpin(0);
  EXPECT_EQ(stash.depth(), 0);
  StashedWeights gone(&stash);
  EXPECT_FALSE(gone.Use(0, 1).ok());
}

// A copy no version needs is reused by the next update, holding that
// update's weights and nothing of the version it held before.
TEST_F(WeightStashTest, ADroppedCopyIsReusedForTheNextVersion) {
  WeightStash stash(backend_.get(), Pointers());
  PinAndUpdateVersion0(&stash);
  std::vector<const float*> first;
  {
    StashedWeights use(&stash);
    ASSERT_TRUE(use.Use(0, 1).ok());
    for (const Param& p : params_) first.push_back(p.value.f32());
  }
  stash.Unpin(0);

  stash.Pin(1);
  ASSERT_TRUE(stash.BeforeUpdate(1).ok());
  Fill(&params_, 3.0f);
  StashedWeights use(&stash);
  ASSERT_TRUE(use.Use(1, 2).ok());
  EXPECT_EQ(Values(params_), std::vector<float>(16, 2.0f));
  for (size_t i = 0; i < params_.size(); ++i) {
    EXPECT_EQ(params_[i].value.f32(), first[i]) << "parameter " << i;
  }
}

// A copy a parameter still holds when its version is dropped is not handed
// to the next update, which would overwrite the weights in use.
TEST_F(WeightStashTest, ACopyInUseIsNotReused) {
  WeightStash stash(backend_.get(), Pointers());
  PinAndUpdateVersion0(&stash);
  std::vector<Tensor> held;
  {
    StashedWeights use(&stash);
    ASSERT_TRUE(use.Use(0, 1).ok());
    for (const Param& p : params_) held.push_back(p.value);
    stash.Unpin(0);  // dropped while in use
  }
  stash.Pin(1);
  ASSERT_TRUE(stash.BeforeUpdate(1).ok());
  for (const Tensor& t : held) {
    EXPECT_EQ(t.ToVector(), std::vector<float>(t.numel(), 1.0f));
  }
}

}  // namespace
}  // namespace pipetrain
