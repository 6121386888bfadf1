#include "metrics/metric_store.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/abi.h"

namespace kiln {
namespace {

TEST(MetricStore, WeightedMeanCountsEverySampleOnce) {
  MetricStore store;
  // Two full batches of 4 and a partial batch of 2: the epoch accuracy is the
  // sample accuracy, not the mean of batch accuracies.
  store.record("val/acc", 1.0, 4, KILN_METRIC_REDUCE_MEAN);
  store.record("val/acc", 0.5, 4, KILN_METRIC_REDUCE_MEAN);
  store.record("val/acc", 0.0, 2, KILN_METRIC_REDUCE_MEAN);
  const auto reduced = store.reduce();
  EXPECT_DOUBLE_EQ(reduced.at("val/acc"), 6.0 / 10.0);
  EXPECT_DOUBLE_EQ(*store.latest("val/acc"), 0.6);
}

TEST(MetricStore, SumMaxMin) {
  MetricStore store;
  for (double v : {3.0, -1.0, 2.0}) {
    store.record("s", v, 1, KILN_METRIC_REDUCE_SUM);
    store.record("hi", v, 1, KILN_METRIC_REDUCE_MAX);
    store.record("lo", v, 1, KILN_METRIC_REDUCE_MIN);
  }
  const auto r = store.reduce();
  EXPECT_DOUBLE_EQ(r.at("s"), 4.0);
  EXPECT_DOUBLE_EQ(r.at("hi"), 3.0);
  EXPECT_DOUBLE_EQ(r.at("lo"), -1.0);
}

TEST(MetricStore, ReduceStartsAFreshEpochButKeepsLatest) {
  MetricStore store;
  store.record("train/loss", 2.0, 1, 0);
  store.reduce();
  EXPECT_TRUE(store.reduce().empty());
  EXPECT_DOUBLE_EQ(*store.latest("train/loss"), 2.0);
  EXPECT_FALSE(store.latest("missing").has_value());
}

TEST(MetricStore, RefusesTwoReductionsForOneMetric) {
  MetricStore store;
  store.record("m", 1.0, 1, KILN_METRIC_REDUCE_SUM);
  EXPECT_THROW(store.record("m", 1.0, 1, KILN_METRIC_REDUCE_MAX), std::invalid_argument);
}

TEST(MetricStore, OneMetricReducedDifferentlyOnTwoRanksIsRefusedNamingTheRanks) {
  MetricStore rank0, rank1;
  rank0.record("val/x", 1.0, 1, KILN_METRIC_REDUCE_MEAN);
  rank1.record("val/x", 3.0, 1, KILN_METRIC_REDUCE_MAX);
  const std::vector<std::string> gathered{rank0.export_pending(), rank1.export_pending()};
  try {
    rank0.reduce_merged(gathered, nullptr);
    FAIL() << "mixed reductions were combined";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "metric 'val/x' is reduced as mean on rank(s) 0 and as max on rank(s) 1: ranks must log a metric "
                 "with the same reduction (the values cannot be combined)");
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(MetricStoreAside, AValidationBetweenSetAsideAndTakeBackSeesOnlyItsOwnRecords) {
  MetricStore store;
  store.record("train/loss", 2.0, 1.0, KILN_METRIC_REDUCE_MEAN);
  store.set_aside();
  store.record("val/loss", 5.0, 1.0, KILN_METRIC_REDUCE_MEAN);
  const auto val = store.reduce();
  EXPECT_EQ(val.size(), 1u);
  EXPECT_EQ(val.at("val/loss"), 5.0);
  store.take_back();
  store.record("train/loss", 4.0, 1.0, KILN_METRIC_REDUCE_MEAN);
  const auto epoch = store.reduce();
  EXPECT_EQ(epoch.at("train/loss"), 3.0);  // both halves of the epoch
  EXPECT_FALSE(epoch.count("val/loss"));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A whole-split value (logged in on_epoch_end) is taken as it is: not a
// mean over ranks, whose rounding would change it (0.1 + 0.1 + 0.1 over 3
// is not 0.1 in binary), and the last one logged counts.
TEST(MetricStoreWholeSplit, AValueIsTakenAsItIsOnEveryRankCount) {
  for (size_t ranks = 1; ranks <= 4; ++ranks) {
    std::vector<std::string> exports;
    for (size_t r = 0; r < ranks; ++r) {
      MetricStore rank;
      rank.record_given("val/auroc", 0.5, 0);
      rank.record_given("val/auroc", 0.1, 0);
      exports.push_back(rank.export_pending());
    }
    MetricStore store;
    std::vector<std::string> warnings;
    const auto out = store.reduce_merged(exports, &warnings);
    EXPECT_EQ(out.at("val/auroc"), 0.1) << ranks << " ranks";
    EXPECT_TRUE(warnings.empty());
  }
}

TEST(MetricStoreWholeSplit, ARankWhoseValueDiffersIsNamedAndTheFirstRanksIsKept) {
  std::vector<std::string> exports;
  for (double v : {0.75, 0.75, 0.5}) {
    MetricStore rank;
    rank.record_given("val/f1_macro", v, 0);
    exports.push_back(rank.export_pending());
  }
  MetricStore store;
  std::vector<std::string> warnings;
  EXPECT_EQ(store.reduce_merged(exports, &warnings).at("val/f1_macro"), 0.75);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("'val/f1_macro' was logged in on_epoch_end with another value on rank(s) 2"),
            std::string::npos)
      << warnings[0];
}

TEST(MetricStoreWholeSplit, APluginCannotAskForTheHostsOwnReduction) {
  MetricStore store;
  EXPECT_THROW(store.record("val/x", 1.0, 1.0, MetricStore::kReduceGiven), std::invalid_argument);
}

}  // namespace
}  // namespace kiln
