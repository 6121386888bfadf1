// Resume across world sizes and batch sizes, with real processes: every
// sample of an interrupted epoch is trained exactly once, counted through a
// data module that records each training batch's indices; an interrupted
// epoch's metrics are the uninterrupted epoch's; what cannot be continued
// exactly is refused before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <tuple>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

constexpr int64_t kSamples = 240;  // divides by 1, 2, 3, 4 and by 8 x those: no padding anywhere

std::filesystem::path probe_manifest(const TempDir& dir, const std::string& trainer_extra = "",
                                     int64_t samples = kSamples) {
  const std::string probe = (test_plugin_dir() / "libkiln_test_index_probe.so").string();
  return write_run_manifest(dir, {.name = "probe",
                                  .run = "seed = 11\nthreads = 1\n",
                                  .model = mlp_keys(8, "[16]", 2),
                                  .data = "path = \"" + probe + "\"\nrecord = \"" + (dir / "indices.txt").string() +
                                          "\"\ntrain_size = " + std::to_string(samples) + "\n",
                                  .trainer = trainer_keys(1, 8, "data_workers = 0\n" + trainer_extra),
                                  .optimizer = "name = \"sgd\"\nlr = 0.05\n",
                                  .extra = "\n[checkpoint]\nevery_n_steps = 1\n"});
}

// How often each sample index was trained, from the probe's record.
std::vector<int> trained_counts(const TempDir& dir, int64_t samples = kSamples) {
  std::vector<int> counts(samples, 0);
  std::istringstream in(read_file(dir / "indices.txt"));
  for (int64_t index; in >> index;) {
    EXPECT_TRUE(index >= 0 && index < samples) << index;
    if (index >= 0 && index < samples) ++counts[index];
  }
  return counts;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class WorldSizes : public testing::TestWithParam<std::tuple<int, int, int>> {};

// A run of `from` processes stops after `steps` optimizer steps (a
// checkpoint each step), inside its only epoch; `--resume last` with `to`
// processes finishes the epoch. Every sample is trained exactly once.
TEST_P(WorldSizes, AMidEpochCheckpointContinuesWithEverySampleTrainedOnce) {
  const auto [from, to, steps] = GetParam();
  TempDir dir;
  const auto m = probe_manifest(dir);
  const ProcessResult first = kiln_fit(m, with(processes(from), {"--set", "trainer.max_steps=" + std::to_string(steps)}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const CheckpointMeta meta = read_meta(CheckpointFile::read(dir / "run" / "checkpoints" / "last.ckpt"));
  EXPECT_EQ(meta.position.next_sample, steps * 8 * from);
  EXPECT_EQ(meta.saved_by.world_size, from);
  const ProcessResult inspected = kiln({"inspect", (dir / "run" / "checkpoints" / "last.ckpt").string()});
  EXPECT_NE(inspected.output.find("sample " + std::to_string(steps * 8 * from) + " of its order"), std::string::npos)
      << inspected.output;
  EXPECT_NE(inspected.output.find(std::string("saved by:      ") + std::to_string(from) + " process"), std::string::npos)
      << inspected.output;
  const ProcessResult resumed = kiln_fit(m, with(processes(to), {"--resume", "last"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("continues from sample " + std::to_string(steps * 8 * from)), std::string::npos)
      << resumed.output;
  const std::vector<int> counts = trained_counts(dir);
  for (int64_t i = 0; i < kSamples; ++i) ASSERT_EQ(counts[i], 1) << "sample " << i << "\n" << resumed.output;
}

INSTANTIATE_TEST_SUITE_P(Resume, WorldSizes,
                         testing::Values(std::make_tuple(2, 1, 5), std::make_tuple(1, 2, 7), std::make_tuple(2, 3, 5),
                                         std::make_tuple(4, 2, 3)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "To" + std::to_string(std::get<1>(info.param));
                         });

// Another batch size, and a split no world size divides (the first run pads
// its shards; the continuation trains no sample twice).
TEST(Resume, AnotherBatchSizeAndAnUnevenSplitTrainEverySampleOnce) {
  TempDir dir;
  const auto m = probe_manifest(dir, "", 241);
  ASSERT_EQ(kiln_fit(m, {"--set", "trainer.max_steps=4"}).exit_code, 0);
  const ProcessResult resumed = kiln_fit(m, {"-n", "3", "--resume", "last", "--set", "trainer.batch_size=5"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<int> counts = trained_counts(dir, 241);
  for (int64_t i = 0; i < 241; ++i) ASSERT_EQ(counts[i], 1) << "sample " << i;
}

// A chain: 2 processes stop inside the epoch, 3 continue and stop again
// (at sample 128, not a whole number of their 24-sample steps), 3 finish.
// The last run has the shape of the run that saved, yet its epoch was
// begun by another: it continues unpadded too, each sample once.
TEST(Resume, AChainOfResumesAcrossShapesTrainsEverySampleOnce) {
  TempDir dir;
  const auto m = probe_manifest(dir, "", 241);
  ASSERT_EQ(kiln_fit(m, {"-n", "2", "--set", "trainer.max_steps=5"}).exit_code, 0);
  const ProcessResult second = kiln_fit(m, {"-n", "3", "--resume", "last", "--set", "trainer.max_steps=7"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(read_meta(CheckpointFile::read(dir / "run" / "checkpoints" / "last.ckpt")).position.next_sample, 128);
  const ProcessResult third = kiln_fit(m, {"-n", "3", "--resume", "last"});
  ASSERT_EQ(third.exit_code, 0) << third.output;
  const std::vector<int> counts = trained_counts(dir, 241);
  for (int64_t i = 0; i < 241; ++i) ASSERT_EQ(counts[i], 1) << "sample " << i;
}

// What cannot be continued exactly is refused: one line naming the
// checkpoint, exit 2, and the run directory as it was.
TEST(Resume, AStepThatWouldStraddleTheCheckpointIsRefusedWithNothingWritten) {
  TempDir dir;
  const auto m = probe_manifest(dir, "accumulate_grad_batches = 2\n");
  ASSERT_EQ(kiln_fit(m, {"-n", "2", "--set", "trainer.max_steps=3"}).exit_code, 0);  // 96 samples
  const std::string csv = read_file(dir / "run" / "metrics.csv");
  const auto before = std::filesystem::last_write_time(dir / "run" / "checkpoints" / "last.ckpt");
  const ProcessResult r = kiln_fit(m, {"-n", "4", "--resume", "last"});  // a step is 64 samples
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto at = r.output.find("kiln: error: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_NE(line.find("last.ckpt"), std::string::npos) << line;
  EXPECT_NE(line.find("accumulate_grad_batches"), std::string::npos) << line;
  EXPECT_EQ(read_file(dir / "run" / "metrics.csv"), csv);
  EXPECT_EQ(std::filesystem::last_write_time(dir / "run" / "checkpoints" / "last.ckpt"), before);

  const ProcessResult limited =
      kiln_fit(m, {"--resume", "last", "--set", "trainer.limit_train_batches=10", "--set", "trainer.accumulate_grad_batches=1"});
  EXPECT_EQ(limited.exit_code, 2) << limited.output;
  EXPECT_NE(limited.output.find("limit_train_batches"), std::string::npos) << limited.output;
}

std::vector<std::map<std::string, double>> metric_rows(const TempDir& dir) {
  auto rows = read_metrics(dir / "run" / "metrics.csv");
  for (auto& row : rows) erase_timings(row);
  return rows;
}

// Two processes stopped inside an epoch and resumed report the epoch the
// uninterrupted run reports, to the bit (metrics.csv), whether or not the
// uninterrupted run saved checkpoints at the same steps.
TEST(Resume, TwoProcessesStoppedInsideAnEpochReportTheUninterruptedEpochsMetrics) {
  TempDir straight, interrupted;
  ASSERT_EQ(kiln_fit(probe_manifest(straight), {"-n", "2", "--set", "trainer.max_epochs=2", "--set",
                                                 "checkpoint.every_n_steps=0", "--set", "checkpoint.every_n_epochs=1"})
                .exit_code,
            0);
  const auto m = probe_manifest(interrupted);
  ASSERT_EQ(kiln_fit(m, {"-n", "2", "--set", "trainer.max_epochs=2", "--set", "trainer.max_steps=6"}).exit_code, 0);
  const ProcessResult resumed = kiln_fit(m, {"-n", "2", "--resume", "last", "--set", "trainer.max_epochs=2"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto a = metric_rows(straight), b = metric_rows(interrupted);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
}

// A preemption (SIGTERM, voted on every 16 steps) of two processes, sent
// once the first epoch's checkpoint is there, so it lands inside a later
// epoch (600 steps each: an epoch's end is one vote in 38), then --resume
// last: every epoch's row, the interrupted one included, is the
// uninterrupted run's.
TEST(Resume, TwoProcessesPreemptedInsideAnEpochReportTheUninterruptedEpochsMetrics) {
  TempDir straight;
  const std::vector<std::string> settings{"-n", "2", "--set", "checkpoint.every_n_steps=0", "--set",
                                          "checkpoint.every_n_epochs=1"};
  auto with_epochs = [&](int64_t epochs) {
    std::vector<std::string> out = settings;
    out.insert(out.end(), {"--set", "trainer.max_epochs=" + std::to_string(epochs)});
    return out;
  };
  // A signal that took an epoch to arrive (a stalled machine) lands on the
  // epoch-end vote instead: that run is not the case under test, and a
  // fresh one is tried, three at most.
  std::unique_ptr<TempDir> interrupted;
  std::filesystem::path m;
  CheckpointMeta meta;
  for (int attempt = 0; attempt < 3 && (attempt == 0 || meta.position.next_batch == 0); ++attempt) {
    interrupted = std::make_unique<TempDir>();
    // It cannot end before the signal: far more epochs than it will run.
    m = probe_manifest(*interrupted, "", 9600);
    const auto last = *interrupted / "run" / "checkpoints" / "last.ckpt";
    std::string command = "\"" + kiln_exe().string() + "\" fit \"" + m.string() + "\"";
    for (const auto& a : with_epochs(100000)) command += " " + a;
    const int tries = static_cast<int>(120 * timeout_scale() / 0.05);
    command += " & pid=$!; n=0; while [ ! -e \"" + last.string() + "\" ] && [ $n -lt " + std::to_string(tries) +
               " ]; do sleep 0.05; n=$((n+1)); done; kill -TERM $pid; wait $pid";
    const ProcessResult preempted = run_process({"/bin/sh", "-c", command}, {.timeout = std::chrono::seconds(300)});
    ASSERT_EQ(preempted.exit_code, 75) << preempted.output;
    meta = read_meta(CheckpointFile::read(last));
  }
  ASSERT_GT(meta.position.next_batch, 0) << "the preemption was expected inside an epoch (three tries)";
  // The interrupted epoch and the ones before it, both ways.
  const int64_t epochs = meta.position.epoch + 1;
  std::vector<std::string> resume = with_epochs(epochs);
  resume.insert(resume.end(), {"--resume", "last"});
  const ProcessResult resumed = kiln_fit(m, resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(kiln_fit(probe_manifest(straight, "", 9600), with_epochs(epochs)).exit_code, 0);
  const auto a = metric_rows(straight), b = metric_rows(*interrupted);
  ASSERT_EQ(a.size(), static_cast<size_t>(epochs));
  EXPECT_EQ(a, b);
}

// Resumed with another number of processes, the interrupted epoch's metrics
// hold every rank's batches from before the checkpoint: the same mean as
// the uninterrupted run, up to the order of the sums.
TEST(Resume, AnotherWorldSizeKeepsEveryRanksMetricsFromBeforeTheCheckpoint) {
  // lr 1e-30: the weights never change (float32 cannot hold the steps), so each sample's loss is the same
  // whichever process trains it when, and the epoch's mean loss must be too.
  TempDir straight, interrupted;
  ASSERT_EQ(kiln_fit(probe_manifest(straight), {"-n", "2", "--set", "optimizer.lr=1e-30", "--set", "checkpoint.every_n_steps=0"})
                .exit_code,
            0);
  const auto m = probe_manifest(interrupted);
  ASSERT_EQ(kiln_fit(m, {"-n", "2", "--set", "trainer.max_steps=5", "--set", "optimizer.lr=1e-30"}).exit_code, 0);
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last", "--set", "optimizer.lr=1e-30"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const double expected = last_value(read_metrics(straight / "run" / "metrics.csv"), "train/loss");
  const double got = last_value(read_metrics(interrupted / "run" / "metrics.csv"), "train/loss");
  EXPECT_NEAR(got, expected, 1e-6 * std::abs(expected));
}

}  // namespace
}  // namespace kiln::test
