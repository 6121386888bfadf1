// Collected rows (kiln_host.collect, ABI 1.2) with real processes: every
// rank gets the whole split, in sample order, each sample once — the same
// bytes with 1, 2, 3 and 4 processes; a resumed epoch gets the rows
// collected before its checkpoint; every misuse ends the run with one line
// naming the plugin, the hook and the name.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <sstream>

#include "common.hpp"

namespace kiln::test {
namespace {

std::string probe() { return (test_plugin_dir() / "libkiln_test_collect_probe.so").string(); }

struct RunSetup {
  std::string model_extra, data, trainer_extra, extra_tables;
};

std::filesystem::path manifest(const TempDir& dir, const RunSetup& s) {
  std::filesystem::create_directories(dir / "dump");
  const std::string data = s.data.empty() ? "path = \"kiln_synthetic\"\ntrain_size = 100\nval_size = 1001\n"
                                            "test_size = 0\nfeatures = 8\nclasses = 4\n"
                                          : s.data;
  write_file(dir / "run.toml",
             "[run]\nname = \"collect\"\ndir = \"" + (dir / "run").string() +
                 "\"\nseed = 5\nthreads = 1\n\n[model]\npath = \"" + probe() +
                 "\"\nid = \"kiln.test.collect_model\"\n" + s.model_extra + "\n[data]\n" + data +
                 "\n[trainer]\nmax_epochs = 1\nbatch_size = 8\nprogress = \"none\"\n" + s.trainer_extra +
                 "\n[optimizer]\nname = \"sgd\"\nlr = 0.05\n\n[[callbacks]]\npath = \"" + probe() +
                 "\"\nid = \"kiln.test.collect_dump\"\ndir = \"" + (dir / "dump").string() + "\"\n" + s.extra_tables);
  return dir / "run.toml";
}

std::vector<std::string> processes(int n) {
  return n == 1 ? std::vector<std::string>{} : std::vector<std::string>{"-n", std::to_string(n)};
}

// The sample indices of a dump, in its order.
std::vector<int64_t> dumped_indices(const std::string& dump) {
  std::istringstream in(dump);
  std::string word;
  int64_t rows = 0, width = 0;
  in >> word >> rows >> word >> width;
  EXPECT_EQ(word, "kiln.index");
  EXPECT_EQ(width, 1);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < rows; ++i) {
    double v = 0;
    in >> v;
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

// 1001 validation samples (odd, and not a multiple of 2, 3 or 4) give the
// same rows, byte for byte, and the same logged values whatever the number
// of processes: rows are ordered by sample index, never by rank.
TEST(Collect, AValidationSplitsRowsAreTheSameBytesWithOneToFourProcesses) {
  std::string first_dump;
  std::map<std::string, double> first_row;
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("processes " + std::to_string(n));
    TempDir dir;
    std::vector<std::string> args{"validate", manifest(dir, {}).string()};
    const auto more = processes(n);
    args.insert(args.end(), more.begin(), more.end());
    const ProcessResult r = kiln(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string dump = read_file(dir / "dump" / "val-0.txt");
    const std::vector<int64_t> indices = dumped_indices(dump);
    ASSERT_EQ(indices.size(), 1001u);
    for (int64_t i = 0; i < 1001; ++i) ASSERT_EQ(indices[i], i);
    auto rows = read_metrics(dir / "run" / "metrics.csv");
    ASSERT_FALSE(rows.empty());
    erase_timings(rows.back());
    EXPECT_EQ(rows.back().at("val/collected_rows"), 1001);
    EXPECT_EQ(rows.back().at("val/index_sum"), 1001.0 * 1000 / 2);
    if (n == 1) {
      first_dump = dump;
      first_row = rows.back();
    } else {
      EXPECT_TRUE(dump == first_dump) << "the rows differ from one process's";
      EXPECT_EQ(rows.back(), first_row);
    }
  }
}

// Training pads its shards (100 samples over 3 ranks: 102 rows); the
// padding repeats are dropped by index, so each sample comes once.
TEST(Collect, TheTrainingSplitGivesEachSampleOnceThoughItsShardsArePadded) {
  TempDir dir;
  const ProcessResult r = kiln_fit(manifest(dir, {"", "", "", ""}), {"-n", "3", "--set", "data.val_size=0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int64_t> indices = dumped_indices(read_file(dir / "dump" / "train-0.txt"));
  std::vector<int64_t> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(indices, expected);
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  EXPECT_EQ(last_value(rows, "train/collected_rows"), 100);
}

// A run stopped inside its epoch (a checkpoint every step) and resumed
// hands the model the same training rows at the epoch's end as a run that
// was never stopped: the rows collected before the checkpoint are in it.
TEST(Collect, AResumedEpochGetsTheRowsCollectedBeforeItsCheckpoint) {
  const RunSetup setup{"", "", "", "\n[checkpoint]\nevery_n_steps = 1\n"};
  TempDir straight, stopped;
  const auto no_val = std::vector<std::string>{"-n", "2", "--set", "data.val_size=0"};
  ASSERT_EQ(kiln_fit(manifest(straight, setup), no_val).exit_code, 0);
  auto args = no_val;
  args.insert(args.end(), {"--set", "trainer.max_steps=3"});
  ProcessResult r = kiln_fit(manifest(stopped, setup), args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  args = no_val;
  args.insert(args.end(), {"--resume", "last"});
  r = kiln_fit(stopped / "run.toml", args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string expected = read_file(straight / "dump" / "train-0.txt");
  EXPECT_EQ(dumped_indices(expected).size(), 100u);
  EXPECT_TRUE(read_file(stopped / "dump" / "train-0.txt") == expected)
      << "the resumed epoch's rows differ from the uninterrupted epoch's";
}

struct Misuse {
  const char* name;
  RunSetup setup;
  int processes;
  std::vector<std::string> expected;  // in the output
};

void PrintTo(const Misuse& m, std::ostream* os) { *os << m.name; }

class Misuses : public testing::TestWithParam<Misuse> {};

TEST_P(Misuses, EndTheRunWithOneLineNamingWhatIsWrong) {
  const Misuse& m = GetParam();
  TempDir dir;
  std::vector<std::string> args = processes(m.processes);
  const ProcessResult r = kiln_fit(manifest(dir, m.setup), args, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const std::string& text : m.expected) EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << "no C++ backtrace:\n" << r.output;
}

const std::string kModel = "kiln.test.collect_model";

INSTANTIATE_TEST_SUITE_P(
    Collect, Misuses,
    testing::Values(
        Misuse{"WrongRows", {"misuse = \"wrong_rows\"\n"}, 1, {kModel, "training_step", "'scores'", "the batch has 8 samples"}},
        Misuse{"CarelessPluginIgnoresTheError", {"misuse = \"ignore_error\"\n"}, 1, {kModel, "training_step", "'scores'"}},
        Misuse{"DtypeChange", {"misuse = \"dtype_change\"\n"}, 1, {kModel, "training_step", "keeps its dtype"}},
        Misuse{"SkippedBatch", {"misuse = \"skip_batch\"\n"}, 1, {kModel, "batch 1 did not collect 'scores'"}},
        Misuse{"OutsideAStep", {"misuse = \"outside_step\"\n"}, 1, {kModel, "on_epoch_end", "outside a step"}},
        Misuse{"RankDiffers", {"misuse = \"rank_differs\"\n"}, 2, {kModel, "rank 1 collected 'scores' as"}},
        Misuse{"OverTheLimit", {"misuse = \"big\"\n", "", "", "\n[metrics]\ncollect_limit_mib = 1\n"}, 1,
               {"metrics.collect_limit_mib", "MiB"}},
        // One step a rank (16 samples, 2 ranks): 4 MiB each, 8 MiB in all.
        Misuse{"OverTheLimitOverAllRanks",
               {"misuse = \"big\"\n", "path = \"kiln_synthetic\"\ntrain_size = 16\nval_size = 0\nfeatures = 8\n", "",
                "\n[metrics]\ncollect_limit_mib = 6\n"},
               2,
               {"over all ranks", "metrics.collect_limit_mib"}},
        Misuse{"FromAPrefetchThread",
               {"", "path = \"" + probe() + "\"\nid = \"kiln.test.collect_data\"\ncollect_in_get_batch = true\n",
                "prefetch = \"thread\"\n"},
               1, {"kiln.test.collect_data", "collected 'target'"}}),
    [](const testing::TestParamInfo<Misuse>& info) { return std::string(info.param.name); });

// A callback built against the frozen 1.0 header (its hooks table ends
// before on_epoch_collected) loads and runs beside a collecting model.
TEST(Collect, AOneDotZeroCallbackRunsBesideACollectingModel) {
  TempDir dir;
  const std::string stub = (test_plugin_dir() / "libkiln_stub_ok_abi_1_0.so").string();
  const ProcessResult r =
      kiln_fit(manifest(dir, {"", "", "", "\n[[callbacks]]\npath = \"" + stub + "\"\n"}), {"--set", "data.val_size=0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(dumped_indices(read_file(dir / "dump" / "train-0.txt")).size(), 100u);
}

}  // namespace
}  // namespace kiln::test
