// Unit tests for checkpoint retention (runtime/ckpt/retention.cpp): file
// names, top-k deletion, and what `--resume last|best` picks. Pure decisions
// on metadata: no files are touched.
#include "ckpt/retention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using kiln::CheckpointInfo;
using kiln::MonitorMode;
using kiln::RetentionPolicy;

namespace {

constexpr std::nullopt_t kNone = std::nullopt;

CheckpointInfo ckpt(const std::string& path, int64_t epoch, int64_t step, std::optional<double> value = kNone) {
  CheckpointInfo c;
  c.path = path;
  c.epoch = epoch;
  c.global_step = step;
  c.monitored = value;
  return c;
}

CheckpointInfo last(int64_t epoch, int64_t step, std::optional<double> value = kNone) {
  CheckpointInfo c = ckpt("last.ckpt", epoch, step, value);
  c.is_last = true;
  return c;
}

RetentionPolicy policy(const std::string& monitor, MonitorMode mode, int64_t top_k) {
  RetentionPolicy p;
  p.monitor = monitor;
  p.mode = mode;
  p.save_top_k = top_k;
  return p;
}

std::vector<std::string> sorted_names(const std::vector<fs::path>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) out.push_back(p.string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CheckpointName, IsZeroPaddedAndSortsByEpochThenStep) {
  EXPECT_EQ(kiln::checkpoint_name(3, 1200), "epoch=0003-step=000001200.ckpt");
  EXPECT_EQ(kiln::checkpoint_name(0, 0), "epoch=0000-step=000000000.ckpt");
  EXPECT_EQ(kiln::checkpoint_name(12345, 1234567890), "epoch=12345-step=1234567890.ckpt");
  EXPECT_LT(kiln::checkpoint_name(2, 999), kiln::checkpoint_name(10, 5));
}

// --- to_delete ----------------------------------------------------------------

struct DeleteCase {
  std::string name;
  std::vector<CheckpointInfo> ranked;
  RetentionPolicy policy;
  std::vector<std::string> expected;  // sorted
};

std::ostream& operator<<(std::ostream& os, const DeleteCase& c) { return os << c.name; }

void PrintTo(const DeleteCase& c, std::ostream* out) { *out << c.name; }

class ToDelete : public ::testing::TestWithParam<DeleteCase> {};

TEST_P(ToDelete, DeletesExactlyTheOnesOutsideTheTopK) {
  const DeleteCase& c = GetParam();
  EXPECT_EQ(sorted_names(kiln::to_delete(c.ranked, c.policy)), c.expected);
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Three checkpoints with a loss: a is best for min, c best for max.
const std::vector<CheckpointInfo> kThree = {ckpt("a", 0, 100, 0.1), ckpt("b", 1, 200, 0.3), ckpt("c", 2, 300, 0.5)};

INSTANTIATE_TEST_SUITE_P(
    Cases, ToDelete,
    ::testing::Values(
        DeleteCase{"keep_all_with_minus_one", kThree, policy("loss", MonitorMode::min, -1), {}},
        DeleteCase{"keep_all_without_monitor", kThree, policy("", MonitorMode::min, -1), {}},
        DeleteCase{"top0_deletes_every_ranked", kThree, policy("loss", MonitorMode::min, 0), {"a", "b", "c"}},
        DeleteCase{"top0_never_deletes_last", {ckpt("a", 0, 1, 1.0), last(0, 1, 1.0)}, policy("loss", MonitorMode::min, 0), {"a"}},
        DeleteCase{"top1_min", kThree, policy("loss", MonitorMode::min, 1), {"b", "c"}},
        DeleteCase{"top1_max", kThree, policy("loss", MonitorMode::max, 1), {"a", "b"}},
        DeleteCase{"top3_keeps_three_of_three", kThree, policy("loss", MonitorMode::min, 3), {}},
        DeleteCase{"top3_of_five_min",
                   {ckpt("s1", 0, 1, 5.0), ckpt("s2", 0, 2, 1.0), ckpt("s3", 0, 3, 4.0), ckpt("s4", 0, 4, 2.0),
                    ckpt("s5", 0, 5, 3.0)},
                   policy("loss", MonitorMode::min, 3),
                   {"s1", "s3"}},
        DeleteCase{"top3_of_five_max",
                   {ckpt("s1", 0, 1, 5.0), ckpt("s2", 0, 2, 1.0), ckpt("s3", 0, 3, 4.0), ckpt("s4", 0, 4, 2.0),
                    ckpt("s5", 0, 5, 3.0)},
                   policy("acc", MonitorMode::max, 3),
                   {"s2", "s4"}},
        DeleteCase{"tie_keeps_the_newer",
                   {ckpt("old", 0, 10, 0.5), ckpt("new", 1, 20, 0.5), ckpt("worse", 2, 30, 0.9)},
                   policy("loss", MonitorMode::min, 1),
                   {"old", "worse"}},
        DeleteCase{"tie_keeps_the_newer_in_any_input_order",
                   {ckpt("new", 1, 20, 0.5), ckpt("old", 0, 10, 0.5)},
                   policy("loss", MonitorMode::max, 1),
                   {"old"}},
        DeleteCase{"tie_on_step_keeps_the_higher_epoch",
                   {ckpt("e1", 1, 20, 0.5), ckpt("e2", 2, 20, 0.5)},
                   policy("loss", MonitorMode::min, 1),
                   {"e1"}},
        DeleteCase{"missing_values_rank_worst_min",
                   {ckpt("none", 0, 40), ckpt("bad", 0, 10, 9.0), ckpt("good", 0, 20, 1.0)},
                   policy("loss", MonitorMode::min, 2),
                   {"none"}},
        DeleteCase{"missing_values_rank_worst_max",
                   {ckpt("none", 0, 40), ckpt("low", 0, 10, -9.0), ckpt("high", 0, 20, 1.0)},
                   policy("acc", MonitorMode::max, 2),
                   {"none"}},
        DeleteCase{"nan_ranks_like_missing",
                   {ckpt("nan", 0, 40, kNaN), ckpt("bad", 0, 10, 9.0), ckpt("good", 0, 20, 1.0)},
                   policy("loss", MonitorMode::min, 2),
                   {"nan"}},
        DeleteCase{"all_missing_keeps_the_newest",
                   {ckpt("s1", 0, 10), ckpt("s3", 0, 30), ckpt("s2", 0, 20)},
                   policy("loss", MonitorMode::min, 1),
                   {"s1", "s2"}},
        DeleteCase{"no_monitor_keeps_the_newest_k_ignoring_values",
                   {ckpt("s1", 0, 10, 0.0), ckpt("s3", 1, 30, 9.0), ckpt("s2", 0, 20, 5.0)},
                   policy("", MonitorMode::min, 2),
                   {"s1"}},
        DeleteCase{"no_monitor_top1", kThree, policy("", MonitorMode::max, 1), {"a", "b"}},
        DeleteCase{"no_monitor_top3_of_three", kThree, policy("", MonitorMode::min, 3), {}},
        DeleteCase{"last_entry_is_never_deleted",
                   {last(2, 300, 99.0), ckpt("a", 0, 100, 0.1), ckpt("b", 1, 200, 0.3)},
                   policy("loss", MonitorMode::min, 1),
                   {"b"}},
        DeleteCase{"empty_input", {}, policy("loss", MonitorMode::min, 1), {}},
        DeleteCase{"infinities_rank_normally",
                   {ckpt("inf", 0, 10, std::numeric_limits<double>::infinity()), ckpt("one", 0, 5, 1.0)},
                   policy("loss", MonitorMode::min, 1),
                   {"inf"}}),
    [](const ::testing::TestParamInfo<DeleteCase>& info) { return info.param.name; });

TEST(ToDeleteOrder, ResultKeepsTheInputOrder) {
  const std::vector<CheckpointInfo> ranked = {ckpt("z", 0, 1, 3.0), ckpt("keep", 0, 2, 0.0), ckpt("a", 0, 3, 2.0)};
  const std::vector<fs::path> out = kiln::to_delete(ranked, policy("loss", MonitorMode::min, 1));
  EXPECT_EQ(out, (std::vector<fs::path>{"z", "a"}));
}

// The mode is a MonitorMode: a mode other than min or max cannot be written.
TEST(ToDeleteMode, WithoutAMonitorTheModeMeansNothing) {
  EXPECT_EQ(kiln::to_delete(kThree, policy("", MonitorMode::max, 3)).size(), 0u);
}

// --- pick_last --------------------------------------------------------------------

struct PickCase {
  std::string name;
  std::vector<CheckpointInfo> valid;
  RetentionPolicy policy;  // unused by pick_last
  std::optional<std::string> expected;
};

std::ostream& operator<<(std::ostream& os, const PickCase& c) { return os << c.name; }

std::optional<std::string> path_of(const std::optional<CheckpointInfo>& c) {
  if (!c) return std::nullopt;
  return c->path.string();
}

void PrintTo(const PickCase& c, std::ostream* out) { *out << c.name; }

class PickLast : public ::testing::TestWithParam<PickCase> {};

TEST_P(PickLast, Picks) {
  const PickCase& c = GetParam();
  EXPECT_EQ(path_of(kiln::pick_last(c.valid)), c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PickLast,
    ::testing::Values(
        PickCase{"empty", {}, {}, kNone},
        PickCase{"last_ckpt_wins_even_if_older", {ckpt("new", 5, 500), last(1, 100)}, {}, std::string("last.ckpt")},
        PickCase{"highest_step_without_last", {ckpt("s2", 0, 20), ckpt("s3", 0, 30), ckpt("s1", 0, 10)}, {},
                 std::string("s3")},
        PickCase{"step_tie_goes_to_higher_epoch", {ckpt("e2", 2, 30), ckpt("e3", 3, 30), ckpt("e1", 1, 10)}, {},
                 std::string("e3")},
        PickCase{"values_do_not_matter", {ckpt("good", 0, 10, 0.0), ckpt("bad", 0, 20, 9.0)}, {},
                 std::string("bad")},
        PickCase{"only_last", {last(0, 1)}, {}, std::string("last.ckpt")}),
    [](const ::testing::TestParamInfo<PickCase>& info) { return info.param.name; });

// --- pick_best --------------------------------------------------------------------

class PickBest : public ::testing::TestWithParam<PickCase> {};

TEST_P(PickBest, Picks) {
  const PickCase& c = GetParam();
  EXPECT_EQ(path_of(kiln::pick_best(c.valid, c.policy)), c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PickBest,
    ::testing::Values(
        PickCase{"empty", {}, policy("loss", MonitorMode::min, 1), kNone},
        PickCase{"min", kThree, policy("loss", MonitorMode::min, 1), std::string("a")},
        PickCase{"max", kThree, policy("acc", MonitorMode::max, 1), std::string("c")},
        PickCase{"tie_goes_to_the_newer_min",
                 {ckpt("new", 1, 20, 0.5), ckpt("old", 0, 10, 0.5), ckpt("worse", 2, 30, 0.9)},
                 policy("loss", MonitorMode::min, 1), std::string("new")},
        PickCase{"tie_goes_to_the_newer_max",
                 {ckpt("old", 0, 10, 0.9), ckpt("new", 1, 20, 0.9), ckpt("worse", 2, 30, 0.1)},
                 policy("acc", MonitorMode::max, 1), std::string("new")},
        PickCase{"step_tie_goes_to_higher_epoch", {ckpt("e2", 2, 20, 0.5), ckpt("e1", 1, 20, 0.5)},
                 policy("loss", MonitorMode::min, 1), std::string("e2")},
        PickCase{"missing_values_are_skipped",
                 {ckpt("none", 0, 99), ckpt("bad", 0, 10, 9.0), ckpt("good", 0, 20, 1.0)}, policy("loss", MonitorMode::min, 1),
                 std::string("good")},
        PickCase{"nan_is_skipped", {ckpt("nan", 0, 99, kNaN), ckpt("one", 0, 10, 1.0)}, policy("loss", MonitorMode::min, 1),
                 std::string("one")},
        PickCase{"no_values_means_newest", {ckpt("s1", 0, 10), ckpt("s3", 0, 30), ckpt("s2", 0, 20)},
                 policy("loss", MonitorMode::min, 1), std::string("s3")},
        PickCase{"no_monitor_means_newest_ignoring_values",
                 {ckpt("good", 0, 10, 0.0), ckpt("newest", 0, 30, 9.0), ckpt("mid", 0, 20, 5.0)},
                 policy("", MonitorMode::min, 1), std::string("newest")},
        PickCase{"last_is_not_ranked",
                 {last(9, 900, 0.0), ckpt("a", 0, 100, 0.2), ckpt("b", 1, 200, 0.3)}, policy("loss", MonitorMode::min, 1),
                 std::string("a")},
        PickCase{"last_is_not_the_newest_either", {last(9, 900), ckpt("a", 0, 100), ckpt("b", 1, 200)},
                 policy("", MonitorMode::min, 1), std::string("b")},
        PickCase{"only_last", {last(9, 900, 0.1)}, policy("loss", MonitorMode::min, 1), std::string("last.ckpt")},
        PickCase{"only_last_without_monitor", {last(9, 900)}, policy("", MonitorMode::min, 1), std::string("last.ckpt")}),
    [](const ::testing::TestParamInfo<PickCase>& info) { return info.param.name; });

}  // namespace
