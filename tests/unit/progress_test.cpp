// The progress display reads the training loss only for what it draws: a
// line every log_every_n_steps, the bar at most 10 times a second. Reading
// it costs a device sync on a GPU, so a read per step would undo what the
// tensor-valued train/loss saves (abi.h, log_metric_tensor).
#include <gtest/gtest.h>

#include <chrono>
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

}  // namespace
}  // namespace kiln
