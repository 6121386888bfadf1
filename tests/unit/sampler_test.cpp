#include "train/sampler.hpp"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(Sampler, EpochOrderIsThePlainLoopsRandpermSequence) {
  // The reference loop draws one randperm per epoch from one generator.
  at::Generator generator = at::detail::createCPUGenerator(7);
  SamplerOptions options;
  options.seed = 7;
  options.batch_size = 10;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    at::Tensor expected = at::randperm(100, generator, at::TensorOptions().dtype(at::kLong));
    const BatchPlan plan = plan_epoch(options, epoch, 100);
    ASSERT_EQ(plan.indices.size(), 100u);
    for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(plan.indices[i], expected[i].item<int64_t>()) << "epoch " << epoch;
  }
}

TEST(Sampler, EpochsDifferAndArePermutations) {
  SamplerOptions options;
  options.batch_size = 7;
  const BatchPlan a = plan_epoch(options, 0, 50), b = plan_epoch(options, 1, 50);
  EXPECT_NE(a.indices, b.indices);
  std::set<int64_t> seen(a.indices.begin(), a.indices.end());
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 49);
}

TEST(Sampler, LastPartialBatchIsKeptUnlessDropLast) {
  SamplerOptions options;
  options.batch_size = 16;
  options.shuffle = false;
  BatchPlan plan = plan_epoch(options, 0, 50);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan.batch_size(3), 2u);
  EXPECT_EQ(plan.batch(1)[0], 16);
  options.drop_last = true;
  plan = plan_epoch(options, 0, 50);
  EXPECT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan.indices.size(), 48u);
}

TEST(Sampler, MaxBatchesLimitsTheEpoch) {
  SamplerOptions options;
  options.batch_size = 4;
  options.max_batches = 2;
  const BatchPlan plan = plan_epoch(options, 0, 100);
  EXPECT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan.indices.size(), 8u);
}

TEST(Sampler, EmptySplitHasNoBatches) {
  SamplerOptions options;
  EXPECT_EQ(plan_epoch(options, 0, 0).size(), 0u);
}

}  // namespace
}  // namespace kiln
