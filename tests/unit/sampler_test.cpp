#include "data/sampler.hpp"

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

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

namespace kiln {
namespace {

TEST(DistributedSampler, ShardsAreDisjointAndCoverTheOrder) {
  SamplerOptions options;
  options.batch_size = 4;
  options.world_size = 3;
  options.equal_shards = false;  // evaluation: every sample exactly once
  std::multiset<int64_t> all;
  for (int64_t r = 0; r < 3; ++r) {
    options.rank = r;
    const BatchPlan plan = plan_epoch(options, 0, 10);
    all.insert(plan.indices.begin(), plan.indices.end());
  }
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 10u);
}

TEST(DistributedSampler, TrainingShardsAreEqualPaddedOrCut) {
  SamplerOptions options;
  options.batch_size = 2;
  options.world_size = 4;
  for (bool drop_last : {false, true}) {
    options.drop_last = drop_last;
    size_t batches = 0;
    for (int64_t r = 0; r < 4; ++r) {
      options.rank = r;
      const BatchPlan plan = plan_epoch(options, 0, 10);
      EXPECT_EQ(plan.indices.size(), drop_last ? 2u : 3u) << "rank " << r;
      if (r == 0) batches = plan.size();
      EXPECT_EQ(plan.size(), batches) << "every rank runs the same number of batches";
    }
  }
}

TEST(DistributedSampler, UnionOfRankBatchesIsTheSingleProcessBatch) {
  // 2 ranks with batch B see, at step k, exactly the samples one process
  // with batch 2B sees at step k: the property the gradient-sync test needs.
  SamplerOptions single;
  single.batch_size = 8;
  const BatchPlan whole = plan_epoch(single, 1, 64);
  SamplerOptions shard = single;
  shard.batch_size = 4;
  shard.world_size = 2;
  shard.rank = 0;
  const BatchPlan r0 = plan_epoch(shard, 1, 64);
  shard.rank = 1;
  const BatchPlan r1 = plan_epoch(shard, 1, 64);
  ASSERT_EQ(r0.size(), whole.size());
  for (size_t b = 0; b < whole.size(); ++b) {
    std::multiset<int64_t> expected(whole.batch(b), whole.batch(b) + whole.batch_size(b));
    std::multiset<int64_t> got(r0.batch(b), r0.batch(b) + r0.batch_size(b));
    got.insert(r1.batch(b), r1.batch(b) + r1.batch_size(b));
    EXPECT_EQ(got, expected) << "batch " << b;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Sampler, BatchesInShardMatchesThePlan) {
  for (int64_t world : {1, 2, 3}) {
    for (bool drop_last : {false, true}) {
      for (bool equal : {false, true}) {
        SamplerOptions o;
        o.batch_size = 4;
        o.world_size = world;
        o.drop_last = drop_last;
        o.equal_shards = equal;
        for (int64_t r = 0; r < world; ++r) {
          o.rank = r;
          EXPECT_EQ(batches_in_shard(o, 23), static_cast<int64_t>(plan_epoch(o, 0, 23).size()))
              << "world " << world << " rank " << r << " drop_last " << drop_last << " equal " << equal;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

void expect_same_plan(const BatchPlan& got, const BatchPlan& expected, const std::string& where) {
  EXPECT_EQ(got.indices, expected.indices) << where;
  EXPECT_EQ(got.offsets, expected.offsets) << where;
}

// The run plans its epochs through EpochOrders, which keeps the generator
// between epochs instead of replaying every earlier draw: the documented
// order (plan_epoch's replay, itself checked against a plain loop's randperm
// sequence above) must come out exactly, whatever order epochs are asked in.
// The batches of every rank, batch by batch: what the epoch trains.
std::vector<std::vector<int64_t>> rank_plans(SamplerOptions options, int64_t world, int64_t length, int64_t epoch = 2) {
  std::vector<std::vector<int64_t>> out;
  options.world_size = world;
  for (int64_t r = 0; r < world; ++r) {
    options.rank = r;
    out.push_back(plan_epoch(options, epoch, length).indices);
  }
  return out;
}

// What an epoch that stopped after `batches` batches of each of `world` ranks
// (batch size `batch`) trained, then continued with `world2` ranks of batch
// `batch2` from the recorded sample position, counts per sample.
std::vector<int> counts_across(int64_t length, int64_t world, int64_t batch, int64_t batches, int64_t world2,
                               int64_t batch2, bool drop_last = false) {
  SamplerOptions options;
  options.seed = 5;
  options.batch_size = batch;
  options.drop_last = drop_last;
  std::vector<int> counts(length, 0);
  for (const auto& plan : rank_plans(options, world, length))
    for (size_t i = 0; i < plan.size() && static_cast<int64_t>(i) < batches * batch; ++i) ++counts[plan[i]];
  options.batch_size = batch2;
  options.first_sample = batches * batch * world;
  options.saved_elsewhere = world != world2 || batch != batch2;
  for (const auto& plan : rank_plans(options, world2, length))
    for (int64_t index : plan) ++counts[index];
  return counts;
}

TEST(ResumedSampler, TheSameWorldAndBatchContinueWithExactlyTheRemainingBatches) {
  for (const bool drop_last : {false, true})
    for (const int64_t world : {1, 2, 3, 4})
      for (const int64_t length : {96, 101, 7}) {
        SamplerOptions options;
        options.seed = 9;
        options.batch_size = 4;
        options.drop_last = drop_last;
        options.world_size = world;
        for (int64_t rank = 0; rank < world; ++rank) {
          options.rank = rank;
          const BatchPlan whole = plan_epoch(options, 1, length);
          for (int64_t k = 0; k <= static_cast<int64_t>(whole.size()); ++k) {
            SamplerOptions resumed = options;
            resumed.first_sample = k * 4 * world;
            const BatchPlan rest = plan_epoch(resumed, 1, length);
            ASSERT_EQ(rest.first_batch, k);
            ASSERT_EQ(rest.size(), whole.size() - k) << "world " << world << " length " << length << " k " << k;
            for (size_t b = 0; b < rest.size(); ++b) {
              const size_t w = b + static_cast<size_t>(k);  // the whole epoch's batch
              ASSERT_EQ(std::vector<int64_t>(rest.batch(b), rest.batch(b) + rest.batch_size(b)),
                        std::vector<int64_t>(whole.batch(w), whole.batch(w) + whole.batch_size(w)));
              ASSERT_EQ(rest.position_after(b), whole.position_after(w));
            }
          }
        }
      }
}

TEST(ResumedSampler, AnotherWorldSizeTrainsEverySampleExactlyOnce) {
  // 2->1, 1->2, 2->3, 4->2, 3->4, with lengths that need no padding and
  // lengths that do (padding repeats the order's start, as a whole epoch's).
  const std::vector<std::tuple<int64_t, int64_t>> worlds{{2, 1}, {1, 2}, {2, 3}, {4, 2}, {3, 4}};
  for (const auto& [w1, w2] : worlds)
    for (int64_t batches = 1; batches < 6; ++batches) {
      const std::vector<int> counts = counts_across(240, w1, 8, batches, w2, 8);
      for (int64_t i = 0; i < 240; ++i)
        ASSERT_EQ(counts[i], 1) << w1 << "->" << w2 << " after " << batches << " batches: sample " << i;
    }
  // A length no world size divides: the first run pads its shards, the
  // continuation does not (it never trains a sample twice).
  for (const auto& [w1, w2] : worlds) {
    const std::vector<int> counts = counts_across(241, w1, 8, 3, w2, 8);
    for (int64_t i = 0; i < 241; ++i) ASSERT_EQ(counts[i], 1) << w1 << "->" << w2 << ": sample " << i;
  }
}

TEST(ResumedSampler, EveryRankRunsAsManyBatchesWithoutARepeatedSample) {
  for (int64_t world : {2, 3, 4})
    for (int64_t batch : {1, 2, 3, 8})
      for (int64_t rest = 0; rest < 60; ++rest) {
        SamplerOptions options;
        options.shuffle = false;  // sample 0 is the one trained before the checkpoint
        options.batch_size = batch;
        options.saved_elsewhere = true;
        options.first_sample = 1;
        std::vector<int> counts(rest + 1, 0);
        std::set<size_t> batch_counts;
        int64_t largest = 0;
        for (const auto& plan : rank_plans(options, world, rest + 1, 0))
          for (int64_t index : plan) ++counts[index];
        options.world_size = world;
        for (int64_t r = 0; r < world; ++r) {
          options.rank = r;
          const BatchPlan plan = plan_epoch(options, 0, rest + 1);
          batch_counts.insert(plan.size());
          for (size_t b = 0; b < plan.size(); ++b) largest = std::max<int64_t>(largest, plan.batch_size(b));
        }
        EXPECT_EQ(batch_counts.size(), 1u) << world << " ranks, batch " << batch << ", " << rest << " left";
        EXPECT_LE(largest, batch);
        int repeated = 0;
        for (int64_t i = 1; i <= rest; ++i) repeated += counts[i] - 1;
        for (int64_t i = 1; i <= rest; ++i) ASSERT_GE(counts[i], 1);
        // Repeats only where no plan without one exists: fewer samples than
        // ranks, or batch size 1.
        if (rest >= world && batch > 1) EXPECT_EQ(repeated, 0) << world << " ranks, batch " << batch << ", " << rest;
      }
}

// Every batch index of a continuation saved elsewhere ends at a position of
// the order: all ranks' batches up to it are exactly the order's samples
// before the position the plan records, so a checkpoint taken after any of
// them (the last two, which share what is left, included) resumes exactly.
TEST(ResumedSampler, EveryBatchEndsAtAPositionOfTheOrder) {
  for (int64_t world : {2, 3, 4})
    for (int64_t batch : {2, 3, 8})
      for (int64_t length = 10; length < 70; length += 7) {
        SamplerOptions options;
        options.shuffle = false;
        options.batch_size = batch;
        options.saved_elsewhere = true;
        options.first_sample = 3;
        options.world_size = world;
        std::vector<BatchPlan> plans;
        for (int64_t r = 0; r < world; ++r) {
          options.rank = r;
          plans.push_back(plan_epoch(options, 0, length));
        }
        std::set<int64_t> trained;
        for (size_t b = 0; b < plans[0].size(); ++b) {
          for (const BatchPlan& plan : plans) trained.insert(plan.batch(b), plan.batch(b) + plan.batch_size(b));
          const int64_t position = plans[0].position_after(b);
          for (const BatchPlan& plan : plans) ASSERT_EQ(plan.position_after(b), position);
          ASSERT_EQ(static_cast<int64_t>(trained.size()), position - 3)
              << world << " ranks, batch " << batch << ", length " << length << ", after batch " << b;
          ASSERT_EQ(*trained.begin(), 3);
          ASSERT_EQ(*trained.rbegin(), position - 1);
        }
        EXPECT_EQ(plans[0].position_after(plans[0].size() - 1), length);
      }
}

TEST(ResumedSampler, AnotherBatchSizeTrainsEverySampleExactlyOnce) {
  const std::vector<int> counts = counts_across(240, 2, 8, 5, 3, 5);
  for (int64_t i = 0; i < 240; ++i) ASSERT_EQ(counts[i], 1) << "sample " << i;
}

TEST(ResumedSampler, APositionPastTheSamplesLeavesNothing) {
  SamplerOptions options;
  options.batch_size = 4;
  options.world_size = 2;
  options.first_sample = 104;  // 101 samples padded to 102, then a last batch of 2 a rank
  const BatchPlan plan = plan_epoch(options, 0, 101);
  EXPECT_EQ(plan.size(), 0u);
  EXPECT_EQ(plan.first_batch, 13);
}

TEST(EpochOrders, GivesExactlyTheReplayedOrderInAnySequence) {
  EpochOrders orders;
  SamplerOptions o;
  o.seed = 11;
  o.batch_size = 7;
  const int64_t n = 103;
  // Sequential, a skip ahead (a resumed run), a step back (restart), a
  // repeat of the same epoch, another seed, another length, then sharding
  // and a batch limit on the same stream.
  const std::vector<std::tuple<uint64_t, int64_t, int64_t>> asks = {
      {11, 0, n}, {11, 1, n}, {11, 2, n}, {11, 9, n}, {11, 10, n}, {11, 4, n}, {11, 4, n},
      {11, 5, n}, {3, 5, n},  {3, 6, n},  {3, 6, 40}, {3, 7, 40}, {11, 30, n}};
  for (const auto& [seed, epoch, length] : asks) {
    o.seed = seed;
    const std::string where =
        "seed " + std::to_string(seed) + " epoch " + std::to_string(epoch) + " length " + std::to_string(length);
    expect_same_plan(plan_epoch(o, epoch, length, orders), plan_epoch(o, epoch, length), where);
  }
  SamplerOptions shard = o;
  shard.world_size = 3;
  shard.max_batches = 2;
  for (int64_t epoch = 31; epoch < 34; ++epoch)
    for (int64_t r = 0; r < 3; ++r) {
      shard.rank = r;
      EpochOrders fresh;
      expect_same_plan(plan_epoch(shard, epoch, n, fresh), plan_epoch(shard, epoch, n),
                       "rank " + std::to_string(r) + " epoch " + std::to_string(epoch));
    }
}

TEST(EpochOrders, ASequentialRunDrawsOncePerEpochAndAResumedOneReplaysOnce) {
  SamplerOptions o;
  o.batch_size = 16;
  EpochOrders sequential;
  for (int64_t epoch = 0; epoch < 20; ++epoch) plan_epoch(o, epoch, 500, sequential);
  EXPECT_EQ(sequential.draws(), 20);  // the replay drew 1 + 2 + ... + 20 = 210

  EpochOrders resumed;  // resumed at epoch 15: 16 draws once, then one per epoch
  for (int64_t epoch = 15; epoch < 20; ++epoch) plan_epoch(o, epoch, 500, resumed);
  EXPECT_EQ(resumed.draws(), 20);

  EpochOrders unshuffled;  // evaluation splits draw nothing
  o.shuffle = false;
  for (int64_t epoch = 0; epoch < 3; ++epoch) plan_epoch(o, epoch, 500, unshuffled);
  EXPECT_EQ(unshuffled.draws(), 0);
}

}  // namespace
}  // namespace kiln
