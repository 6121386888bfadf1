// [trainer] max_time and val_check_interval with real processes: a timed
// stop at a step boundary every rank agrees on, its checkpoint and resume,
// and validation inside epochs that a mid-epoch resume repeats exactly.
#include <gtest/gtest.h>

#include <regex>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

std::filesystem::path manifest(const TempDir& dir, const std::string& trainer_lines, const std::string& checkpoint) {
  return write_run_manifest(dir, {.name = "cadence",
                                  .run = "seed = 3\nthreads = 1\ndeterministic = true\n",
                                  .model = mlp_keys(32, "[32]", 4) + "dropout = 0.2\n",
                                  .trainer = "batch_size = 32\nprogress = \"none\"\n" + trainer_lines + "\n",
                                  .extra = checkpoint});
}

int64_t last_step(const TempDir& dir) {
  return read_meta(CheckpointFile::read(dir / "run" / "checkpoints" / "last.ckpt")).position.global_step;
}

// Every "fit done: E epochs, S steps" line's S.
std::vector<int64_t> steps_done(const std::string& output) {
  std::vector<int64_t> out;
  const std::regex done(R"(fit done: \d+ epochs, (\d+) steps \(max_time=)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), done); it != std::sregex_iterator(); ++it)
    out.push_back(std::stoll((*it)[1]));
  return out;
}

TEST(MaxTime, StopsAtAStepBoundaryWithACheckpointThatResumes) {
  TempDir dir;
  const auto m = manifest(dir, "max_epochs = -1\nmax_time = \"00:00:02\"", "\n[checkpoint]\nevery_n_epochs = 1\n");
  const ProcessResult r = kiln_fit(m);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stopping: max_time=00:00:02 reached (step "), std::string::npos) << r.output;
  const std::vector<int64_t> done = steps_done(r.output);
  ASSERT_EQ(done.size(), 1u) << r.output;
  // The checkpoint is where the fit stopped, whether inside an epoch or at its end.
  EXPECT_EQ(last_step(dir), done[0]);
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last", "--set", "trainer.max_time=\"\"", "--set",
                                        "trainer.max_steps=" + std::to_string(done[0] + 3)});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find(std::to_string(done[0] + 3) + " steps (max_steps="), std::string::npos)
      << resumed.output;
}

TEST(MaxTime, TwoProcessesStopTogetherAtTheSameStep) {
  TempDir dir;
  const auto m = manifest(dir, "max_epochs = -1\nmax_time = \"00:00:03\"", "\n[checkpoint]\nevery_n_epochs = 1\n");
  const ProcessResult r = kiln_fit(m, {"-n", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int64_t> done = steps_done(r.output);
  // Rank 0 reports. A rank that stopped alone would have left the other
  // waiting in the next gradient all-reduce (a peer failure, not exit 0),
  // and the checkpoint is committed only when both ranks wrote it.
  ASSERT_EQ(done.size(), 1u) << r.output;
  EXPECT_EQ(last_step(dir), done[0]);
}

TEST(MaxTime, WithoutCheckpointsItStopsAndWritesNone) {
  TempDir dir;
  const ProcessResult r = kiln_fit(manifest(dir, "max_epochs = -1\nmax_time = \"00:00:01\"", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(steps_done(r.output).size(), 1u) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints"));
}

TEST(ValCheckInterval, ValidatesInsideEpochsWithARowAtEachStep) {
  TempDir dir;
  ASSERT_EQ(kiln_fit(manifest(dir, "max_epochs = 2\nval_check_interval = 0.25", "")).exit_code, 0);
  // 32 batches an epoch: after batches 8, 16, 24 and at each epoch's end.
  std::vector<double> val_steps;
  for (const auto& row : read_metrics(dir / "run" / "metrics.csv"))
    if (row.count("val/loss")) val_steps.push_back(row.at("step"));
  EXPECT_EQ(val_steps, (std::vector<double>{8, 16, 24, 32, 40, 48, 56, 64}));
}

TEST(ValCheckInterval, ResumeFromAMidEpochCheckpointIsExact) {
  TempDir straight, interrupted;
  const std::string trainer = "max_epochs = 3\nval_check_interval = 10";
  const std::string checkpoint = "\n[checkpoint]\nevery_n_epochs = 1\nevery_n_steps = 5\n";
  ASSERT_EQ(kiln_fit(manifest(straight, trainer, checkpoint)).exit_code, 0);
  const auto m = manifest(interrupted, trainer, checkpoint);
  const ProcessResult first = kiln_fit(m, {"--set", "trainer.max_steps=45"});  // epoch 1, batch 13
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto rows_a = read_metrics(straight / "run" / "metrics.csv");
  auto rows_b = read_metrics(interrupted / "run" / "metrics.csv");
  for (auto* rows : {&rows_a, &rows_b})
    for (auto& row : *rows) erase_timings(row);
  EXPECT_EQ(rows_a.size(), 12u);  // 3 validations inside and one row at the end, 3 epochs
  EXPECT_EQ(rows_a, rows_b);
}

}  // namespace
}  // namespace kiln::test
