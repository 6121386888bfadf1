// The progress display reads the training loss only for what it draws: a
// line every log_every_n_steps, the bar at most 10 times a second. Reading
// it costs a device sync on a GPU, so a read per step would undo what the
// tensor-valued train/loss saves (abi.h, log_metric_tensor).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>

#include "train/progress.hpp"

namespace kiln {
namespace {

struct CountingLoss {
  int64_t reads = 0;
  double operator()() {
    ++reads;
    return 0.5;
  }
};

int64_t run_epoch(Progress& progress, int64_t batches) {
  CountingLoss loss;
  progress.begin("epoch 0", batches);
  for (int64_t b = 0; b < batches; ++b) progress.step(b, [&loss] { return loss(); });
  progress.end();
  return loss.reads;
}

TEST(Progress, LinesReadTheLossOnlyOnTheStepsTheyPrint) {
  Progress every5(Progress::Mode::lines, 5);
  EXPECT_EQ(run_epoch(every5, 12), 3);  // batches 5, 10 and the last, 12
  Progress never(Progress::Mode::lines, 0);
  EXPECT_EQ(run_epoch(never, 12), 0);
  Progress quiet(Progress::Mode::none, 1);
  EXPECT_EQ(run_epoch(quiet, 12), 0);
}

TEST(Progress, TheBarReadsTheLossOnlyWhenItRedraws) {
  Progress bar(Progress::Mode::bar, 50);
  const auto start = std::chrono::steady_clock::now();
  const int64_t reads = run_epoch(bar, 20000);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  // At most one redraw per 100 ms, plus the last batch's.
  EXPECT_GE(reads, 1);
  EXPECT_LE(reads, 2 + ms.count() / 100) << "in " << ms.count() << " ms";
}

TEST(Progress, ClockTextReadsAsAClock) {
  EXPECT_EQ(clock_text(0), "00:00");
  EXPECT_EQ(clock_text(59.4), "00:59");
  EXPECT_EQ(clock_text(61), "01:01");
  EXPECT_EQ(clock_text(3600), "1:00:00");
  EXPECT_EQ(clock_text(3 * 3600 + 62), "3:01:02");
  EXPECT_EQ(clock_text(-1), "?");
  EXPECT_EQ(clock_text(NAN), "?");
}

// One second a batch on a fake clock: the epoch's and the fit's elapsed and
// remaining times, as the lines print them.
TEST(Progress, LinesShowElapsedAndRemainingForTheEpochAndTheFit) {
  auto now = std::chrono::steady_clock::time_point{};
  Progress lines(Progress::Mode::lines, 5, [&now] { return now; });
  // Epoch 0 of 0..2, 10 batches.
  lines.begin("epoch 0", 10, {0, 2});
  for (int64_t b = 0; b < 5; ++b) {
    now += std::chrono::seconds(1);
    lines.step(b, [] { return 0.5; });
  }
  // 5 s in, 5 batches left of this epoch and 20 of the two after it.
  EXPECT_EQ(lines.last_times(), "[00:05<00:05] fit [00:05<00:25]");
  for (int64_t b = 5; b < 10; ++b) {
    now += std::chrono::seconds(1);
    lines.step(b, [] { return 0.5; });
  }
  lines.end();
  now += std::chrono::seconds(10);  // validation: the fit's clock runs on
  lines.begin("epoch 1", 10, {1, 2});
  for (int64_t b = 0; b < 5; ++b) {
    now += std::chrono::seconds(1);
    lines.step(b, [] { return 0.5; });
  }
  // The fit: 25 s for 15 batches so far; 15 to go.
  EXPECT_EQ(lines.last_times(), "[00:05<00:05] fit [00:25<00:25]");
  lines.end();
  // Evaluation (no fit place): the epoch's times only; a resumed epoch
  // counts from its first batch.
  lines.begin("validate", 10);
  for (int64_t b = 3; b < 5; ++b) {
    now += std::chrono::seconds(2);
    lines.step(b);
  }
  EXPECT_EQ(lines.last_times(), "[00:04<00:10]");
  lines.end();
}

}  // namespace
}  // namespace kiln
