// What a fit checks around its loop (issue 23): the sanity validation before
// the first training step, overfit_batches, and non-finite losses — real
// `kiln fit` processes, their call logs, files and what the user is told.
#include <gtest/gtest.h>

#include <regex>

#include "integration/common.hpp"

namespace kiln::test {
namespace {

// The recorder's call log, one "label:hook" per entry.
std::vector<std::string> calls(const TempDir& dir) {
  std::vector<std::string> out;
  std::istringstream in(read_file(dir / "calls.log"));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// model:validation_step calls before the first model:training_step.
int validations_before_training(const std::vector<std::string>& log) {
  int n = 0;
  for (const std::string& line : log) {
    if (line == "model:training_step") break;
    if (line == "model:validation_step") ++n;
  }
  return n;
}

int count(const std::vector<std::string>& log, const std::string& line) {
  return static_cast<int>(std::count(log.begin(), log.end(), line));
}

// The checkpoints' steps, from their file names (…-step=000000005.ckpt).
std::vector<int64_t> checkpoint_steps(const std::filesystem::path& dir) {
  std::vector<int64_t> out;
  if (!std::filesystem::is_directory(dir)) return out;
  const std::regex step("step=(\\d+)\\.ckpt$");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_search(name, m, step)) out.push_back(std::stoll(m[1]));
  }
  std::sort(out.begin(), out.end());
  return out;
}

const char* kSmallFit = "max_epochs = 2\nbatch_size = 4\n";

TEST(SanityCheck, AValidationStepBugShowsBeforeAnyTrainingStepAndCleansUp) {
  TempDir dir;
  const auto m = recorder_manifest(dir, "fail_at = [\"validation_step\"]", "", "", kSmallFit);
  const ProcessResult r = kiln_fit(m);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("kiln: error: plugin 'test.recorder_model' [model] failed in validation_step on rank 0: "
                          "injected failure in validation_step (in the sanity check before the first training step: "
                          "val batch 0 of 2"),
            std::string::npos)
      << r.output;
  const auto log = calls(dir);
  EXPECT_EQ(count(log, "model:training_step"), 0) << "no training step ran";
  // The cleanup sequence of any failure (docs/hooks.md): on_exception, then
  // teardown, callbacks first, the data module last.
  std::vector<std::string> cleanup;
  for (const std::string& line : log)
    if (line.find("on_exception(") != std::string::npos || line.find("teardown(") != std::string::npos)
      cleanup.push_back(line);
  const std::string why = "on_exception(test.recorder_model/validation_step)";
  EXPECT_EQ(cleanup, (std::vector<std::string>{"callback:" + why, "model:" + why, "data:" + why,
                                               "callback:teardown(failed=1)", "model:teardown(failed=1)",
                                               "data:teardown(failed=1)"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "metrics.csv")) << "nothing was logged";
}

// With two processes and the bug on rank 1 only: rank 0, whose check
// passed, does not go on to train either; the run names rank 1's failure.
TEST(SanityCheck, ABugOnOneRankStopsEveryRankBeforeAnyTrainingStep) {
  TempDir dir;
  // Rank 1 fails only once rank 0's two checked batches are in the log:
  // otherwise rank 1's failure could stop rank 0 before its own check ran.
  const auto m = recorder_manifest(dir,
                                   "fail_at = [\"validation_step\"]\nfail_on_rank = 1\n"
                                   "val_wait_for = \"model@0:validation_step\"\nval_wait_times = 2\nval_wait_on_rank = 1",
                                   "", "", std::string(kSmallFit) + "\n[distributed]\nprocesses = 2\n");
  const ProcessResult r = kiln_fit(m, {}, std::chrono::seconds(180));
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("failed in validation_step on rank 1: injected failure in validation_step (in the sanity "
                          "check before the first training step"),
            std::string::npos)
      << r.output;
  // Rank 0, left waiting for rank 1 after its own check, says what it
  // waited for: not gradients, which no step had computed.
  EXPECT_EQ(r.output.find("to hand over its gradients"), std::string::npos) << r.output;
  const auto log = calls(dir);
  EXPECT_EQ(count(log, "model@0:validation_step"), 2) << "rank 0's own check passed";
  EXPECT_EQ(count(log, "model@0:training_step") + count(log, "model@1:training_step"), 0)
      << "no rank trained\n" << read_file(dir / "calls.log");
}

TEST(SanityCheck, RunsItsBatchesLogsNothingAndIsNotRunOnResume) {
  TempDir dir;
  const auto m = recorder_manifest(dir, "", "", "", std::string(kSmallFit) + "\n[checkpoint]\n");
  const ProcessResult with = kiln_fit(m);
  ASSERT_EQ(with.exit_code, 0) << with.output;
  EXPECT_EQ(validations_before_training(calls(dir)), 2) << "Lightning's default: 2 batches";
  auto rows_with = read_metrics(dir / "run" / "metrics.csv");

  TempDir off_dir;
  const auto off = recorder_manifest(off_dir, "", "", "", std::string(kSmallFit) + "num_sanity_val_steps = 0\n");
  const ProcessResult without = kiln_fit(off);
  ASSERT_EQ(without.exit_code, 0) << without.output;
  EXPECT_EQ(validations_before_training(calls(off_dir)), 0);
  auto rows_without = read_metrics(off_dir / "run" / "metrics.csv");
  ASSERT_EQ(rows_with.size(), rows_without.size());
  for (size_t i = 0; i < rows_with.size(); ++i) {
    erase_timings(rows_with[i]);
    erase_timings(rows_without[i]);
    EXPECT_EQ(rows_with[i], rows_without[i]) << "row " << i << ": the sanity check's records leaked into the metrics";
  }

  // All of the split (-1), then a resumed fit: none.
  TempDir all_dir;
  const auto all = recorder_manifest(all_dir, "", "", "", std::string(kSmallFit) + "num_sanity_val_steps = -1\n");
  ASSERT_EQ(kiln_fit(all).exit_code, 0);
  EXPECT_EQ(validations_before_training(calls(all_dir)), 4) << "16 samples in batches of 4";
  write_file(dir / "calls.log", "");
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last", "--set", "trainer.max_epochs=3"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(validations_before_training(calls(dir)), 0) << "a resumed fit runs no sanity check";
  EXPECT_GT(count(calls(dir), "model:training_step"), 0);
}

// overfit_batches: the first N training batches, unshuffled, are trained and
// validated on, every epoch; nothing else is read.
TEST(OverfitBatches, TrainsAndValidatesOnTheSameFirstBatchesInOrder) {
  for (const std::string& setting : {"3", "0.1"}) {  // 240 samples in batches of 8: 30 batches, a tenth is 3
    TempDir dir;
    const std::string probe = (test_plugin_dir() / "libkiln_test_index_probe.so").string();
    write_run_manifest(dir, {.name = "",
                             .run = "threads = 1\n",
                             .model = mlp_keys(8, "[8]", 2),
                             .data = "path = \"" + probe + "\"\nrecord = \"" + (dir / "indices.txt").string() +
                                     "\"\ntrain_size = 240\nval_size = 40\n",
                             .trainer = trainer_keys(2, 8, "overfit_batches = " + setting + "\n"),
                             .optimizer = ""});
    const ProcessResult r = kiln_fit(dir / "run.toml");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::map<std::string, int> seen;
    std::istringstream in(read_file(dir / "indices.txt"));
    for (std::string line; std::getline(in, line);) ++seen[line];
    auto batch = [](int b) {
      std::string s;
      for (int i = 8 * b; i < 8 * b + 8; ++i) s += (i > 8 * b ? " " : "") + std::to_string(i);
      return s;
    };
    // Sanity check: batches 0 and 1; each epoch trains 0-2 and validates 0-2.
    EXPECT_EQ(seen, (std::map<std::string, int>{{batch(0), 5}, {batch(1), 5}, {batch(2), 4}}))
        << "overfit_batches = " << setting << "\n" << read_file(dir / "indices.txt");
    EXPECT_NE(r.output.find("trainer.overfit_batches: training and validating on the first 3 of the train split's 30 "
                            "batches, in order"),
              std::string::npos)
        << r.output;
  }
}

// The non-finite checks: a recorder model whose loss turns NaN at training
// call 5 (optimizer step 6), 4 steps an epoch, log points every 4 steps.
std::string nan_trainer(const std::string& mode) {
  return "max_epochs = 3\nbatch_size = 4\nlog_every_n_steps = 4\ndetect_nonfinite = \"" + mode + "\"\n";
}

TEST(DetectNonfinite, RaiseNamesTheStepCommitsNoCheckpointOfItAndCleansUp) {
  TempDir dir;
  const auto m = recorder_manifest(dir, "nan_from_step = 5", "", "",
                                   nan_trainer("raise") + "\n[checkpoint]\nevery_n_steps = 1\nsave_top_k = -1\n"
                                                          "every_n_epochs = 0\n");
  const ProcessResult r = kiln_fit(m);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // The checkpoint of step 6 reads its one-step window: the exact step.
  EXPECT_NE(r.output.find("kiln: error: kiln failed on rank 0: trainer.detect_nonfinite: the training loss and the "
                          "weights became NaN or inf at step 6 (epoch 1); no checkpoint of these weights is committed"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(checkpoint_steps(dir / "run" / "checkpoints"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  const auto log = calls(dir);
  EXPECT_EQ(count(log, "model:failure=HOST_ERROR"), 1) << read_file(dir / "calls.log");
  EXPECT_EQ(count(log, "data:teardown(failed=1)"), 1);
}

TEST(DetectNonfinite, WarnNamesTheWindowOnceAndTrainsOn) {
  TempDir dir;
  const auto m = recorder_manifest(dir, "nan_from_step = 5", "", "", nan_trainer("warn"));
  const ProcessResult r = kiln_fit(m);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line = "trainer.detect_nonfinite: the training loss became NaN or inf between step 4 and 8 (epoch 1)";
  const size_t at = r.output.find(line);
  EXPECT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("trainer.detect_nonfinite", at + line.size()), std::string::npos) << "said once";
  EXPECT_EQ(count(calls(dir), "model:training_step"), 12) << "trained on";
}

// With "warn", an epoch's checkpoint of non-finite weights is not committed,
// and the line names the epoch its steps ran in (the checkpoint itself
// continues with the next one).
TEST(DetectNonfinite, WarnCommitsNoCheckpointOfNonfiniteWeightsAndNamesTheirEpoch) {
  TempDir dir;
  const auto m = recorder_manifest(dir, "nan_from_step = 5", "", "",
                                   nan_trainer("warn") + "\n[checkpoint]\nevery_n_epochs = 1\nsave_top_k = -1\n");
  const ProcessResult r = kiln_fit(m);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trainer.detect_nonfinite: the weights became NaN or inf at step 8 (epoch 1); the "
                          "checkpoint at step 8 is not committed"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(checkpoint_steps(dir / "run" / "checkpoints"), (std::vector<int64_t>{4}));
}

TEST(DetectNonfinite, RaiseEndsEveryRankTogether) {
  TempDir dir;
  const auto m = recorder_manifest(dir, "nan_from_step = 5\nnan_on_rank = 1", "", "",
                                   nan_trainer("raise") + "\n[distributed]\nprocesses = 2\n");
  const ProcessResult r = kiln_fit(m, {}, std::chrono::seconds(180));
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // 8 samples a rank: 2 steps an epoch, log points at epoch ends and every
  // 4 steps. Rank 1's loss of step 6 is NaN; rank 0's is not (the NaN
  // gradients reach its weights after it), and both say the same.
  const std::string line = "trainer.detect_nonfinite: the training loss became NaN or inf between step 4 and 6 "
                           "(epoch 2) on 1 rank(s)";
  for (const char* rank : {"0", "1"})
    EXPECT_NE(r.output.find(std::string("kiln failed on rank ") + rank + ": " + line), std::string::npos)
        << rank << "\n" << r.output;
  const auto log = calls(dir);
  for (const char* rank : {"0", "1"})
    EXPECT_EQ(count(log, std::string("model@") + rank + ":teardown(failed=1)"), 1) << rank << "\n" << read_file(dir / "calls.log");
}

}  // namespace
}  // namespace kiln::test
