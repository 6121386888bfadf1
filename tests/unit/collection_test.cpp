// Collected rows (metrics/collection): what a step may hand over, and the
// merge of every rank's rows into the whole split — in sample order, each
// sample once, whatever the number of ranks.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "metrics/collection.hpp"

namespace kiln {
namespace {

// One step of `indices` collecting "x" = the indices as float (and "y" =
// twice them), as a model's step would.
void step(Collection& c, const std::vector<int64_t>& indices, int64_t batch) {
  c.begin_step(indices.data(), indices.size(), batch);
  const at::Tensor x = at::tensor(indices, at::kLong).to(at::kFloat);
  ASSERT_EQ(c.add("x", x), "");
  ASSERT_EQ(c.add("y", (x * 2).unsqueeze(1)), "");
  ASSERT_EQ(c.end_step(), "");
}

std::vector<int64_t> column(const std::vector<std::pair<std::string, at::Tensor>>& merged, const std::string& name) {
  for (const auto& [n, t] : merged)
    if (n == name) {
      const at::Tensor v = t.to(at::kLong).reshape({-1}).contiguous();
      return std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
    }
  ADD_FAILURE() << "no column " << name;
  return {};
}

// 10 samples in a shuffled order, dealt to `world` ranks as
// DistributedSampler does (padded by repeating the order's start), two
// samples a batch: the merged rows are 0..9 once, in order, for any world.
TEST(Collection, EveryRanksRowsMergeIntoTheSplitInSampleOrderOnce) {
  const std::vector<int64_t> order{7, 2, 9, 0, 4, 1, 8, 3, 6, 5};
  for (int64_t world = 1; world <= 4; ++world) {
    std::vector<int64_t> padded = order;
    while (padded.size() % world) padded.push_back(order[padded.size() - order.size()]);
    std::vector<std::string> ranks;
    for (int64_t r = 0; r < world; ++r) {
      std::vector<int64_t> shard;
      for (size_t i = r; i < padded.size(); i += world) shard.push_back(padded[i]);
      Collection c;
      for (size_t b = 0; b * 2 < shard.size(); ++b)
        step(c, std::vector<int64_t>(shard.begin() + b * 2, shard.begin() + std::min(shard.size(), b * 2 + 2)), b);
      ranks.push_back(c.serialize());
    }
    const auto merged = merge_collections(ranks);
    const std::vector<int64_t> expected{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    EXPECT_EQ(column(merged, kIndexColumn), expected) << world << " ranks";
    EXPECT_EQ(column(merged, "x"), expected);
    EXPECT_EQ(merged.back().second.sizes(), (std::vector<int64_t>{10, 1}));
  }
}

// A padding repeat keeps its first occurrence (earliest batch, then rank):
// rows computed by a later model state never replace it.
TEST(Collection, ARepeatedSampleKeepsItsEarliestRow) {
  Collection a, b;
  a.begin_step(std::vector<int64_t>{3}.data(), 1, 0);
  ASSERT_EQ(a.add("v", at::tensor({1.0})), "");
  ASSERT_EQ(a.end_step(), "");
  b.begin_step(std::vector<int64_t>{3}.data(), 1, 5);
  ASSERT_EQ(b.add("v", at::tensor({2.0})), "");
  ASSERT_EQ(b.end_step(), "");
  for (const auto& order : {std::vector<std::string>{a.serialize(), b.serialize()},
                            std::vector<std::string>{b.serialize(), a.serialize()}}) {
    const auto merged = merge_collections(order);
    EXPECT_EQ(merged.back().second.item<double>(), 1.0);
  }
}

// A checkpoint's merged rows come back before every batch of the run.
TEST(Collection, RestoredRowsComeBeforeThisRunsAndKeepTheirColumns) {
  Collection before;
  step(before, {4, 5}, 0);
  const std::string saved = serialize_merged(merge_collections({before.serialize()}));
  Collection after;
  after.restore(saved);
  step(after, {1, 5}, 1);
  const auto merged = merge_collections({after.serialize()});
  EXPECT_EQ(column(merged, kIndexColumn), (std::vector<int64_t>{1, 4, 5}));
  Collection other;
  other.restore(saved);
  other.begin_step(std::vector<int64_t>{0}.data(), 1, 2);
  EXPECT_NE(other.add("x", at::tensor({0.0}, at::kDouble)).find("keeps its dtype"), std::string::npos);
}

TEST(Collection, RowsThatDoNotFitTheBatchAreRefusedByName) {
  Collection c;
  const std::vector<int64_t> four{0, 1, 2, 3};
  EXPECT_NE(c.add("x", at::zeros({4})).find("outside a step"), std::string::npos);
  c.begin_step(four.data(), four.size(), 0);
  EXPECT_NE(c.add("x", at::zeros({3})).find("collected 'x' with shape [3] but the batch has 4 samples"),
            std::string::npos);
  EXPECT_NE(c.add("x", at::zeros({})).find("the batch has 4 samples"), std::string::npos);
  EXPECT_NE(c.add("kiln.index", at::zeros({4})).find("host's"), std::string::npos);
  EXPECT_NE(c.add("z", at::zeros({4}, at::kComplexFloat)).find("complex"), std::string::npos);
  ASSERT_EQ(c.add("x", at::zeros({4, 2})), "");
  EXPECT_NE(c.add("x", at::zeros({4, 2})).find("twice in one step"), std::string::npos);
  ASSERT_EQ(c.end_step(), "");
  c.begin_step(four.data(), four.size(), 1);
  EXPECT_NE(c.add("x", at::zeros({4, 3})).find("as Float [N, 3] after Float [N, 2]"), std::string::npos);
  EXPECT_NE(c.end_step().find("batch 1 did not collect 'x'"), std::string::npos);
  EXPECT_EQ(c.rows(), 4);  // the refused step's rows left with it
}

TEST(Collection, ANameFirstCollectedAfterStepsThatCollectedNothingIsRefused) {
  Collection c;
  const std::vector<int64_t> two{0, 1};
  c.begin_step(two.data(), two.size(), 0);
  ASSERT_EQ(c.end_step(), "");
  c.begin_step(two.data(), two.size(), 1);
  ASSERT_EQ(c.add("x", at::zeros({2})), "");
  EXPECT_NE(c.end_step().find("earlier steps of the epoch collected nothing"), std::string::npos);
  EXPECT_EQ(c.rows(), 0);
}

// Ranks that collected nothing (a checkpoint before any step, a short
// shard) merge into an empty table (UBSan: no null pointer to memcpy).
TEST(Collection, NothingCollectedMergesIntoAnEmptyTable) {
  Collection none, some;
  step(some, {2, 0}, 0);
  EXPECT_EQ(merge_collections({none.serialize(), none.serialize()}).front().second.numel(), 0);
  EXPECT_EQ(column(merge_collections({none.serialize(), some.serialize()}), kIndexColumn),
            (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(merge_collections({}).size(), 1u);
}

TEST(Collection, BytesThatLieAboutTheirShapeAreRefused) {
  Collection c;
  step(c, {0, 1}, 0);
  std::string bytes = c.serialize();
  EXPECT_THROW(merge_collections({bytes.substr(0, bytes.size() - 1)}), std::invalid_argument);
  EXPECT_THROW(merge_collections({"not rows"}), std::invalid_argument);
  Collection other;
  other.begin_step(std::vector<int64_t>{2}.data(), 1, 0);
  ASSERT_EQ(other.add("x", at::zeros({1})), "");
  ASSERT_EQ(other.end_step(), "");
  EXPECT_THROW(merge_collections({bytes, other.serialize()}), std::invalid_argument) << "ranks with other columns";
}

}  // namespace
}  // namespace kiln
