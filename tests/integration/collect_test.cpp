// Collected rows (kiln_host.collect, ABI 1.2) with real processes: every
// rank gets the whole split, in sample order, each sample once — the same
// bytes with 1, 2, 3 and 4 processes; a resumed epoch gets the rows
// collected before its checkpoint; every misuse ends the run with one line
// naming the plugin, the hook and the name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "common.hpp"

namespace kiln::test {
namespace {

// The 1-to-4-process loops are correctness checks of numbers, run by the
// plain variants (Debian's and the wheel's LibTorch); under the sanitizers
// (KILN_TEST_TIMEOUT_SCALE > 1) they would cost minutes of CI's budget for
// no more memory checking than the shorter Collect tests give.
#define KILN_PLAIN_VARIANTS_ONLY()                                                                 \
  do {                                                                                             \
    if (timeout_scale() > 1)                                                                       \
      GTEST_SKIP() << "a multi-run numeric check: run by the plain variants, not under sanitizers"; \
  } while (0)

std::string probe() { return (test_plugin_dir() / "libkiln_test_collect_probe.so").string(); }

struct RunSetup {
  std::string model_extra, data, trainer_extra, extra_tables;
};

std::filesystem::path manifest(const TempDir& dir, const RunSetup& s) {
  std::filesystem::create_directories(dir / "dump");
  const std::string data = s.data.empty() ? "path = \"kiln_synthetic\"\ntrain_size = 100\nval_size = 1001\n"
                                            "test_size = 0\nfeatures = 8\nclasses = 4\n"
                                          : s.data;
  return write_run_manifest(
      dir, {.name = "collect",
            .run = "seed = 5\nthreads = 1\n",
            .model = "path = \"" + probe() + "\"\nid = \"kiln.test.collect_model\"\n" + s.model_extra + "\n",
            .data = data,
            .trainer = trainer_keys(1, 8, s.trainer_extra),
            .optimizer = "name = \"sgd\"\nlr = 0.05\n",
            .extra = "\n[[callbacks]]\npath = \"" + probe() + "\"\nid = \"kiln.test.collect_dump\"\ndir = \"" +
                     (dir / "dump").string() + "\"\n" + s.extra_tables});
}

// The sample indices of a dump, in its order.
std::vector<int64_t> dumped_indices(const std::string& dump) {
  std::istringstream in(dump);
  std::string word;
  int64_t rows = 0, width = 0;
  in >> word >> rows >> word;
  if (word == "confusion") {
    std::getline(in, word);
    in >> word;
  }
  in >> width;
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
  KILN_PLAIN_VARIANTS_ONLY();
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

// The shipped classifiers' whole-split metrics (kiln_mlp: val/auroc,
// val/f1_macro, from rows collected in validation_step) are the same bits
// with 1 to 4 processes, and equal scikit-learn's on the same rows, as does
// the confusion matrix a callback writes with kiln/metrics.hpp.
TEST(Collect, ClassifierMetricsEqualScikitLearnWithOneToFourProcesses) {
  KILN_PLAIN_VARIANTS_ONLY();
  KILN_REQUIRE_CHECK_PYTHON();
  const RunSetup mlp{"", "", "", ""};
  std::map<std::string, double> first;
  TempDir check;
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("processes " + std::to_string(n));
    TempDir dir;
    manifest(dir, mlp);
    std::string text = read_file(dir / "run.toml");
    const std::string model = "path = \"" + probe() + "\"\nid = \"kiln.test.collect_model\"\n";
    ASSERT_NE(text.find(model), std::string::npos);
    text.replace(text.find(model), model.size(), "path = \"kiln_mlp\"\nin_features = 8\nhidden = [16]\nclasses = 4\n");
    write_file(dir / "run.toml", text);
    std::vector<std::string> args{"validate", (dir / "run.toml").string()};
    const auto more = processes(n);
    args.insert(args.end(), more.begin(), more.end());
    const ProcessResult r = kiln(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto rows = read_metrics(dir / "run" / "metrics.csv");
    ASSERT_FALSE(rows.empty());
    erase_timings(rows.back());
    ASSERT_TRUE(rows.back().count("val/auroc") && rows.back().count("val/f1_macro")) << r.output;
    const std::string dump = read_file(dir / "dump" / "val-0.txt");
    if (n == 1) {
      first = rows.back();
      std::filesystem::copy_file(dir / "dump" / "val-0.txt", check / "val.txt");
      continue;
    }
    // Bit for bit: the whole-split values and the confusion matrix. (The
    // means val/loss and val/acc add up in another order with other shards;
    // and a sample's scores may differ in their last bits with the size of
    // the batch that computed them — BLAS picks kernels by shape — which no
    // ordering of rows can undo: docs/metrics.md.)
    for (const char* name : {"val/auroc", "val/f1_macro"}) {
      const double a = rows.back().at(name), b = first.at(name);
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << name << " " << a << " vs " << b;
    }
    const std::string first_dump = read_file(check / "val.txt");
    EXPECT_EQ(dump.substr(0, dump.find("target")), first_dump.substr(0, first_dump.find("target")))
        << "the same confusion matrix and the same sample indices, in the same order";
    EXPECT_EQ(dump.substr(dump.find("target"), dump.find("scores") - dump.find("target")),
              first_dump.substr(first_dump.find("target"), first_dump.find("scores") - first_dump.find("target")));
  }
  write_file(check / "check.py", R"(import sys
import numpy as np
from sklearn.metrics import roc_auc_score, f1_score, confusion_matrix
lines = open(sys.argv[1]).read().split("\n")
rows = int(lines[0].split()[1])
confusion = np.array([int(v) for v in lines[1].split()[1:]])
at = 2
columns = {}
while at < len(lines) and lines[at]:
    name, width = lines[at].split()
    columns[name] = np.array([[float(v) for v in l.split()] for l in lines[at + 1:at + 1 + rows]])
    at += 1 + rows
scores, target = columns["scores"], columns["target"][:, 0].astype(np.int64)
classes = scores.shape[1]
auroc = roc_auc_score(target, scores, multi_class="ovr", labels=list(range(classes)))
f1 = f1_score(target, scores.argmax(1), average="macro", labels=list(range(classes)))
cm = confusion_matrix(target, scores.argmax(1), labels=list(range(classes))).reshape(-1)
ok = abs(auroc - float(sys.argv[2])) <= 1e-9 and abs(f1 - float(sys.argv[3])) <= 1e-9 and (cm == confusion).all()
print("sklearn auroc %.17g f1 %.17g confusion %s; kiln %s %s %s" % (auroc, f1, cm.tolist(), sys.argv[2], sys.argv[3], confusion.tolist()))
sys.exit(0 if ok else 1)
)");
  char auroc[40], f1[40];
  std::snprintf(auroc, sizeof auroc, "%.17g", first.at("val/auroc"));
  std::snprintf(f1, sizeof f1, "%.17g", first.at("val/f1_macro"));
  const ProcessResult r =
      run_process({check_python().string(), (check / "check.py").string(), (check / "val.txt").string(), auroc, f1});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A whole-split value is a metric like any other on every rank: the
// checkpoint ranking and early stopping read it (every rank's early
// stopping sees it, so the stop is agreed without a missing-metric warning).
TEST(Collect, CheckpointMonitorAndEarlyStoppingWorkOnAWholeSplitValueAcrossRanks) {
  KILN_PLAIN_VARIANTS_ONLY();
  TempDir dir;
  const std::string data = "path = \"kiln_synthetic\"\ntrain_size = 256\nval_size = 255\ntest_size = 0\nfeatures = 8\n"
                           "classes = 4\nnoise = 3.0\n";
  const std::string extra =
      "\n[[callbacks]]\npath = \"kiln_early_stopping\"\nmonitor = \"val/auroc\"\nmode = \"max\"\npatience = 1\n"
      "min_delta = 1.0\n\n[checkpoint]\nevery_n_epochs = 1\nmonitor = \"val/auroc\"\nmode = \"max\"\nsave_top_k = 1\n";
  manifest(dir, {"", data, "", extra});
  std::string text = read_file(dir / "run.toml");
  const std::string model = "path = \"" + probe() + "\"\nid = \"kiln.test.collect_model\"\n";
  text.replace(text.find(model), model.size(), "path = \"kiln_mlp\"\nin_features = 8\nhidden = [16]\nclasses = 4\n");
  write_file(dir / "run.toml", text);
  const ProcessResult r = kiln_fit(dir / "run.toml", {"-n", "2", "--set", "trainer.max_epochs=6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("has not been recorded"), std::string::npos) << r.output;
  // min_delta 1.0 is never beaten: the second validation stops the run.
  EXPECT_NE(r.output.find("fit done: 2 epochs"), std::string::npos) << r.output;
  std::vector<std::pair<double, int64_t>> by_auroc;
  for (const auto& row : read_metrics(dir / "run" / "metrics.csv"))
    if (row.count("val/auroc")) by_auroc.emplace_back(row.at("val/auroc"), static_cast<int64_t>(row.at("step")));
  ASSERT_EQ(by_auroc.size(), 2u);
  const auto best = std::max_element(by_auroc.begin(), by_auroc.end());
  char name[64];
  std::snprintf(name, sizeof name, "epoch=%04lld-step=%09lld.ckpt", static_cast<long long>(best->second / 16),
                static_cast<long long>(best->second));
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "checkpoints" / name)) << name << "\n" << r.output;
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
        // The training step's misuses, without the sanity check (whose
        // validation_step would meet them first: InTheSanityCheck below).
        Misuse{"WrongRows", {"misuse = \"wrong_rows\"\n", "", "num_sanity_val_steps = 0\n"}, 1,
               {kModel, "training_step", "'scores'", "the batch has 8 samples"}},
        Misuse{"CarelessPluginIgnoresTheError", {"misuse = \"ignore_error\"\n", "", "num_sanity_val_steps = 0\n"}, 1,
               {kModel, "training_step", "'scores'"}},
        Misuse{"DtypeChange", {"misuse = \"dtype_change\"\n", "", "num_sanity_val_steps = 0\n"}, 1,
               {kModel, "training_step", "keeps its dtype"}},
        Misuse{"WrongRowsInTheSanityCheck", {"misuse = \"wrong_rows\"\n"}, 1,
               {kModel, "validation_step", "'scores'", "in the sanity check before the first training step"}},
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
                "data_workers = 1\n"},
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
