// [logging]: kiln's CSV, JSON Lines and TensorBoard files from real `kiln
// fit` runs. The event file is read by TensorBoard's own reader (the checking
// Python's EventAccumulator), and each scalar must be where metrics.csv and
// metrics.jsonl put it; a run killed after a checkpoint and resumed shows
// every step exactly once in every file; with two processes only rank 0
// writes.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <set>
#include <thread>

#include "common.hpp"
#include "logged_files.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

TEST(Logging, TensorBoardsReaderFindsEveryScalarWhereMetricsCsvAndJsonlPutIt) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  // 3 epochs of 32 steps, a per-step cosine schedule: the rate changes every step.
  const auto m = synthetic_manifest(dir, std::string("\n[scheduler]\nname = \"cosine\"\ninterval = \"step\"\n") + kAllLoggers);
  const ProcessResult r = kiln_fit(m, {"--set", "trainer.log_every_n_steps=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto csv = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u);  // metrics.csv keeps its epoch rows only
  const auto scalars = by_tag_and_step(tensorboard_scalars(dir.path()));
  std::set<std::string> epoch_tags;
  for (const auto& row : csv) {
    const int64_t step = static_cast<int64_t>(row.at("step"));
    for (const auto& [column, value] : row) {
      if (column == "step") continue;
      epoch_tags.insert(column);
      const auto it = scalars.find({column, step});
      ASSERT_NE(it, scalars.end()) << column << " at step " << step << " is missing from the event file";
      expect_float_equal(it->second, value, column + " at step " + std::to_string(step));
    }
    // The monitors are metrics like any other.
    EXPECT_GT(row.at("train/samples_per_sec"), 0) << step;
    EXPECT_GT(row.at("train/step_time"), 0) << step;
    // The rate the epoch's last step used: cosine over 96 steps, period step - 1.
    EXPECT_NEAR(row.at("lr-Adam"), 0.01 * (1 + std::cos(M_PI * (step - 1) / 96.0)) / 2, 1e-9) << step;
  }
  EXPECT_TRUE(epoch_tags.count("lr-Adam") && epoch_tags.count("val/loss") && epoch_tags.count("epoch"));

  // metrics.jsonl: the same epoch rows, and a step row every 5 steps.
  const auto jsonl = read_jsonl(dir / "run" / "metrics.jsonl");
  std::vector<int64_t> step_rows;
  size_t epoch_row = 0;
  for (const auto& row : jsonl) {
    const int64_t step = std::stoll(row.at("step"));
    if (row.at("kind") == "epoch") {
      ASSERT_LT(epoch_row, csv.size());
      for (const auto& [column, value] : csv[epoch_row]) EXPECT_NEAR(std::stod(row.at(column)), value, std::fabs(value) * 1e-8) << column;
      EXPECT_EQ(row.size(), csv[epoch_row].size() + 1) << "kind, epoch, step and the same metrics";
      ++epoch_row;
      continue;
    }
    ASSERT_EQ(row.at("kind"), "step");
    step_rows.push_back(step);
    EXPECT_EQ(std::stoll(row.at("epoch")), (step - 1) / 32);
    for (const char* tag : {"train/loss_step", "lr-Adam_step", "train/samples_per_sec_step", "train/step_time_step"}) {
      ASSERT_TRUE(row.count(tag)) << tag << " at step " << step;
      const auto it = scalars.find({tag, step});
      ASSERT_NE(it, scalars.end()) << tag << " at step " << step << " is missing from the event file";
      expect_float_equal(it->second, std::stod(row.at(tag)), std::string(tag) + " at step " + std::to_string(step));
    }
    EXPECT_NEAR(std::stod(row.at("lr-Adam_step")), 0.01 * (1 + std::cos(M_PI * (step - 1) / 96.0)) / 2, 1e-12);
  }
  EXPECT_EQ(epoch_row, csv.size());
  std::vector<int64_t> expected;
  for (int64_t s = 5; s <= 96; s += 5) expected.push_back(s);
  EXPECT_EQ(step_rows, expected);
  // Nothing in the event file that the text files do not have.
  EXPECT_EQ(scalars.size(), csv.size() * epoch_tags.size() + expected.size() * 4);
}

// The recorder's model hangs in its 18th training step (after 17 steps);
// checkpoints every 5 steps, so the last is at step 15, and the step row and
// the epoch row at step 16 were logged after it. The resumed run repeats
// step 16: every file must show it once.
std::filesystem::path hanging_manifest(const TempDir& dir, const std::string& model_extra, int processes = 1) {
  const std::string data = "size = " + std::to_string(32 * processes) + "\nfeatures = 4";
  return recorder_manifest(dir, "features = 4\n" + model_extra, data, "",
                           "max_epochs = 3\nbatch_size = 4\nlog_every_n_steps = 2\n[optimizer]\nname = \"sgd\"\nlr = 0.1\n"
                           "[checkpoint]\nevery_n_steps = 5\nevery_n_epochs = 0\nsave_top_k = 1\n" +
                               std::string(kAllLoggers));
}

TEST(Logging, AResumedRunContinuesEveryFileWithEachStepOnce) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir straight, killed;
  const ProcessResult s = kiln_fit(hanging_manifest(straight, ""));
  ASSERT_EQ(s.exit_code, 0) << s.output;

  const auto m = hanging_manifest(killed, "hang_on_rank = 0\nhang_after = 17");
  {
    BackgroundRun run(killed, [&] { return kiln_fit(m); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(120 * timeout_scale());
    // Hung, and step 15's checkpoint durable: commits are asynchronous, so
    // the write may still be under way when the step hangs.
    const auto step_15 = killed / "run" / "checkpoints" / "epoch=0001-step=000000015.ckpt";
    while ((read_file(killed / "calls.log").find("model:training_step hangs") == std::string::npos ||
            !std::filesystem::exists(step_15)) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_NE(read_file(killed / "calls.log").find("model:training_step hangs"), std::string::npos);
    ASSERT_TRUE(std::filesystem::exists(step_15));
    for (pid_t p : processes_mentioning(killed.path().string())) ::kill(p, SIGKILL);
    EXPECT_EQ(run.result().signal, SIGKILL) << run.result().output;
  }
  // Rows the checkpoint (step 15) never saw are in the files now.
  const auto before = jsonl_rows(killed / "run" / "metrics.jsonl");
  EXPECT_EQ(before.back(), "epoch 16");
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last", "--set", "model.hang_on_rank=-1"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step 15"), std::string::npos) << resumed.output;

  // The same rows as the run that was never interrupted, each once.
  const auto rows = jsonl_rows(killed / "run" / "metrics.jsonl");
  EXPECT_EQ(rows, jsonl_rows(straight / "run" / "metrics.jsonl"));
  EXPECT_EQ(std::set<std::string>(rows.begin(), rows.end()).size(), rows.size());
  const auto csv = read_metrics(killed / "run" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[1].at("step"), 16);
  // TensorBoard: each (tag, step) once, the same ones as the straight run, and
  // the deterministic values equal (the loss of each logged step).
  expect_the_same_scalars(straight.path(), killed.path(), [](const std::string& tag) {
    return tag == "train/loss_step" || tag == "train/loss" || tag == "lr-SGD";
  });
}

TEST(Logging, WithTwoProcessesOnlyRankZeroWrites) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  // 64 samples over 2 ranks, 4 a batch: 8 steps an epoch, 24 in all.
  const ProcessResult r = kiln({"fit", hanging_manifest(dir, "", 2).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> expected;
  for (int64_t step = 2; step <= 24; step += 2) {
    expected.push_back("step " + std::to_string(step));
    if (step % 8 == 0) expected.push_back("epoch " + std::to_string(step));
  }
  EXPECT_EQ(jsonl_rows(dir / "run" / "metrics.jsonl"), expected);
  const auto scalars = by_tag_and_step(tensorboard_scalars(dir.path()));
  EXPECT_EQ(scalars.count({"train/loss_step", 24}), 1u);
  // Throughput counts both ranks' samples: 8 a step.
  const auto csv = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u);
  for (const auto& row : csv) EXPECT_GT(row.at("train/samples_per_sec"), 0);
}

TEST(Logging, TheDefaultIsMetricsCsvAloneAndAnEmptyListWritesNoMetricsFile) {
  TempDir plain, none;
  ASSERT_EQ(kiln_fit(synthetic_manifest(plain)).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(plain / "run" / "metrics.csv"));
  EXPECT_FALSE(std::filesystem::exists(plain / "run" / "metrics.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(plain / "run" / "events.out.tfevents.kiln"));
  const auto rows = read_metrics(plain / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].at("lr-Adam"), 0.01);
  ASSERT_EQ(kiln_fit(synthetic_manifest(none, "\n[logging]\nloggers = []\n")).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(none / "run" / "metrics.csv"));
  EXPECT_FALSE(std::filesystem::exists(none / "run" / "metrics.jsonl"));
}

}  // namespace
}  // namespace kiln::test
