// distributed.shard = optimizer's partition (optim/shard_layout.hpp): the
// trainable values in one flat space padded to a multiple of the world
// size, rank r owning the r-th equal part; every value owned exactly once.
#include <gtest/gtest.h>

#include "optim/shard_layout.hpp"

namespace kiln {
namespace {

TEST(ShardLayout, EveryValueIsOwnedByExactlyOneRankAndThePaddingByTheLast) {
  const std::vector<int64_t> numels{260, 13, 91, 7, 21, 3};  // kiln_mlp 20-13-7-3: 395 values
  for (int64_t world : {1, 2, 3, 4, 7, 400}) {
    std::vector<int> owners(395, 0);
    for (int64_t r = 0; r < world; ++r) {
      const ShardLayout layout(numels, world, r);
      EXPECT_EQ(layout.total(), 395);
      EXPECT_EQ(layout.shard_size(), (395 + world - 1) / world);
      EXPECT_EQ(layout.padded() % world, 0);
      int64_t in_shard = 0;
      for (size_t i = 0; i < numels.size(); ++i) {
        const ShardLayout::Run run = layout.owned(i);
        ASSERT_GE(run.begin, 0);
        ASSERT_LE(run.begin + run.length, numels[i]);
        if (run.length > 0) {
          // Where it lies in the rank's part: inside it, in the flat order.
          EXPECT_EQ(layout.position_in_shard(i), layout.offset(i) + run.begin - r * layout.shard_size());
          EXPECT_GE(layout.position_in_shard(i), 0);
          EXPECT_LE(layout.position_in_shard(i) + run.length, layout.shard_size());
        }
        for (int64_t k = 0; k < run.length; ++k) ++owners[layout.offset(i) + run.begin + k];
        in_shard += run.length;
      }
      EXPECT_LE(in_shard, layout.shard_size());
    }
    for (int64_t v = 0; v < 395; ++v) ASSERT_EQ(owners[v], 1) << "value " << v << " with " << world << " ranks";
  }
}

TEST(ShardLayout, AParameterStraddlingTwoRanksIsSplitWhereTheirPartsMeet) {
  // 10 + 10 values over 3 ranks: parts of 7; the first parameter is 0-6 on
  // rank 0 and 7-9 on rank 1; the second 0-3 on rank 1 and 4-9 on rank 2.
  const ShardLayout r0({10, 10}, 3, 0), r1({10, 10}, 3, 1), r2({10, 10}, 3, 2);
  EXPECT_EQ(r0.owned(0).begin, 0);
  EXPECT_EQ(r0.owned(0).length, 7);
  EXPECT_EQ(r0.owned(1).length, 0);
  EXPECT_EQ(r1.owned(0).begin, 7);
  EXPECT_EQ(r1.owned(0).length, 3);
  EXPECT_EQ(r1.owned(1).begin, 0);
  EXPECT_EQ(r1.owned(1).length, 4);
  EXPECT_EQ(r1.position_in_shard(1), 3);
  EXPECT_EQ(r2.owned(1).begin, 4);
  EXPECT_EQ(r2.owned(1).length, 6);
  EXPECT_EQ(r2.padded(), 21);  // one value of padding, on the last rank
}

}  // namespace
}  // namespace kiln
