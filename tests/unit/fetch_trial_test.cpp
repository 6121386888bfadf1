// trainer.data_workers = "auto": the trial's bookkeeping (data/fetch_trial.hpp),
// with made-up step times. The streams that run it are tested with a fake
// data module in concurrency_test.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "data/fetch_trial.hpp"

namespace {

using kiln::FetchMode;
using kiln::FetchTrial;

const FetchTrial::Shape kShape{2, 5, 2};  // warm-up 2, windows of 5 (3 timed steps), 2 per mode

std::vector<double> steps(double seconds, size_t n = 3) { return std::vector<double>(n, seconds); }

// Runs the trial's windows as a stream would, with step times by mode;
// returns the modes of the windows in the order they ran.
std::vector<FetchMode> run_windows(FetchTrial& trial, double inline_s, double thread_s) {
  std::vector<FetchMode> order;
  size_t into = 0;
  const size_t epoch = 1000;
  while (trial.running()) {
    const FetchTrial::Segment s = trial.next_segment(into, epoch - into);
    if (s.timed) {
      order.push_back(s.mode);
      trial.record(s.mode, steps(s.mode == FetchMode::inline_ ? inline_s : thread_s));
    }
    into += s.length;
  }
  return order;
}

TEST(FetchTrial, WarmsUpInTheFallbackThenTimesWindowsInABBAOrder) {
  FetchTrial trial(FetchMode::thread, kShape);
  const FetchTrial::Segment warmup = trial.next_segment(0, 100);
  EXPECT_EQ(warmup.mode, FetchMode::thread);
  EXPECT_EQ(warmup.length, 2u);
  EXPECT_FALSE(warmup.timed);
  const FetchTrial::Segment first = trial.next_segment(2, 98);
  EXPECT_TRUE(first.timed);
  EXPECT_EQ(first.length, 5u);
  EXPECT_EQ(run_windows(trial, 1.0, 1.0),
            (std::vector<FetchMode>{FetchMode::inline_, FetchMode::thread, FetchMode::thread, FetchMode::inline_}));
}

TEST(FetchTrial, KeepsTheFasterModeForTheRestOfTheRun) {
  FetchTrial slow_thread(FetchMode::thread, kShape);
  run_windows(slow_thread, 100e-6, 130e-6);
  EXPECT_FALSE(slow_thread.running());
  EXPECT_EQ(slow_thread.mode(), FetchMode::inline_);
  const FetchTrial::Segment rest = slow_thread.next_segment(30, 70);
  EXPECT_EQ(rest.mode, FetchMode::inline_);
  EXPECT_EQ(rest.length, 70u);
  EXPECT_FALSE(rest.timed);
  EXPECT_NE(slow_thread.verdict().find("inline (a step took 100 us with get_batch inline, 130 us with worker "
                                       "threads; 12 steps timed)"),
            std::string::npos)
      << slow_thread.verdict();

  FetchTrial slow_inline(FetchMode::inline_, kShape);
  run_windows(slow_inline, 130e-6, 100e-6);
  EXPECT_EQ(slow_inline.mode(), FetchMode::thread);
  EXPECT_EQ(slow_inline.next_segment(0, 50).mode, FetchMode::thread) << "no warm-up once decided";
}

// A mode far slower than the other ends the trial early: its windows are
// what the trial costs.
TEST(FetchTrial, AModeFarSlowerEndsTheTrialEarly) {
  const FetchTrial::Shape four{0, 5, 4};  // 4 windows per mode: 8 in all
  FetchTrial far(FetchMode::thread, four);  // 3.5x: after the first pair
  EXPECT_EQ(run_windows(far, 140e-6, 490e-6), (std::vector<FetchMode>{FetchMode::inline_, FetchMode::thread}));
  EXPECT_EQ(far.mode(), FetchMode::inline_);
  EXPECT_NE(far.verdict().find("6 steps timed"), std::string::npos) << far.verdict();

  FetchTrial clear(FetchMode::inline_, four);  // 1.5x: after A B B A
  EXPECT_EQ(run_windows(clear, 150e-6, 100e-6).size(), 4u);
  EXPECT_EQ(clear.mode(), FetchMode::thread);

  FetchTrial close(FetchMode::thread, four);  // 1.1x: every window
  EXPECT_EQ(run_windows(close, 110e-6, 100e-6).size(), 8u);
  EXPECT_EQ(close.mode(), FetchMode::thread);
}

TEST(FetchTrial, OneSlowStepDoesNotDecide) {
  // A step that waited for a checkpoint inside an inline window: 50x a step.
  FetchTrial trial(FetchMode::thread, FetchTrial::Shape{0, 10, 2});
  for (int w = 0; w < 4; ++w) {
    const FetchTrial::Segment s = trial.next_segment(static_cast<size_t>(w) * 10, 100);
    std::vector<double> seconds = steps(s.mode == FetchMode::inline_ ? 100e-6 : 110e-6, 8);
    if (w == 0) seconds[3] = 5e-3;
    trial.record(s.mode, seconds);
  }
  EXPECT_EQ(trial.mode(), FetchMode::inline_) << trial.verdict();
}

TEST(FetchTrial, ACostEveryOtherStepCounts) {
  // A wake-up every second step (thread: 100 and 140 us, 120 on average)
  // against a steady 115 us inline: the median would say thread.
  FetchTrial trial(FetchMode::thread, FetchTrial::Shape{0, 10, 2});
  for (int w = 0; w < 4; ++w) {
    const FetchTrial::Segment s = trial.next_segment(static_cast<size_t>(w) * 10, 100);
    std::vector<double> seconds(8, 115e-6);
    if (s.mode == FetchMode::thread)
      for (size_t i = 0; i < seconds.size(); ++i) seconds[i] = i % 2 ? 140e-6 : 100e-6;
    trial.record(s.mode, seconds);
  }
  EXPECT_EQ(trial.mode(), FetchMode::inline_) << trial.verdict();
}

TEST(FetchTrial, AnEpochTooShortForAWindowRunsInTheFallbackAndTheTrialGoesOn) {
  FetchTrial trial(FetchMode::inline_, kShape);
  EXPECT_EQ(trial.next_segment(0, 4).length, 2u);  // warm-up
  const FetchTrial::Segment rest = trial.next_segment(2, 2);
  EXPECT_EQ(rest.mode, FetchMode::inline_);
  EXPECT_EQ(rest.length, 2u);
  EXPECT_FALSE(rest.timed);
  EXPECT_TRUE(trial.running());
  EXPECT_TRUE(trial.next_segment(2, 5).timed) << "a longer epoch runs the first window";
}

TEST(FetchTrial, TrimmedMeanLeavesOutTheSlowestEighth) {
  EXPECT_DOUBLE_EQ(FetchTrial::trimmed_mean({1, 1, 1, 1, 1, 1, 1, 100}), 1.0);
  EXPECT_DOUBLE_EQ(FetchTrial::trimmed_mean({1, 3}), 2.0);
  EXPECT_DOUBLE_EQ(FetchTrial::trimmed_mean({}), 0.0);
}

TEST(FetchTrial, WithoutAMeasurementAThreadOnlyWhereACoreIsLeftOver) {
  EXPECT_EQ(kiln::unmeasured_mode(1, 1, 2), FetchMode::thread);
  EXPECT_EQ(kiln::unmeasured_mode(2, 1, 2), FetchMode::inline_);
  EXPECT_EQ(kiln::unmeasured_mode(3, 2, 4), FetchMode::inline_);
  EXPECT_EQ(kiln::unmeasured_mode(2, 2, 4), FetchMode::thread);
  EXPECT_GE(kiln::usable_cores(), 1);
}

// trainer.data_workers = auto on the CPU before anything is measured: inline
// only when the intra-op threads fill the cores (a rank's share of them); one
// process with a core left over runs the trial, whatever the worker count;
// several processes go by what is left over. The log line says what is true.
TEST(AutoStart, RunsTheTrialInOneProcessWhenACoreIsLeftOver) {
  using Kind = kiln::AutoStart::Kind;
  EXPECT_EQ(kiln::auto_start(1, 1, 2, 1).kind, Kind::trial);
  // run.threads = 1 on 2 cores with 2 prefetch threads: a core is left over
  // beside the intra-op thread; it went inline untried, logging "1 intra-op
  // thread fill the 2 cores".
  const kiln::AutoStart two = kiln::auto_start(1, 2, 2, 1);
  EXPECT_EQ(two.kind, Kind::trial);
  EXPECT_EQ(kiln::auto_start(3, 4, 8, 1).kind, Kind::trial);
}

TEST(AutoStart, GathersInlineWhenTheIntraOpThreadsFillTheCores) {
  using Kind = kiln::AutoStart::Kind;
  const kiln::AutoStart two = kiln::auto_start(2, 1, 2, 1);
  EXPECT_EQ(two.kind, Kind::inline_);
  const kiln::AutoStart one = kiln::auto_start(1, 1, 1, 1);
  EXPECT_EQ(one.kind, Kind::inline_);
  EXPECT_EQ(kiln::auto_start(4, 1, 2, 1).kind, Kind::inline_);
}

TEST(AutoStart, SeveralProcessesGoByTheirShareOfTheCoresWithoutATrial) {
  using Kind = kiln::AutoStart::Kind;
  const kiln::AutoStart filled = kiln::auto_start(1, 1, 2, 2);  // two one-thread ranks on 2 cores
  EXPECT_EQ(filled.kind, Kind::inline_);
  EXPECT_EQ(filled.share, 1);
  EXPECT_EQ(kiln::auto_start(1, 1, 4, 2).kind, Kind::thread);
  EXPECT_EQ(kiln::auto_start(1, 2, 4, 2).kind, Kind::inline_) << "two prefetch threads do not fit beside it";
  EXPECT_EQ(kiln::auto_start(2, 1, 8, 2).kind, Kind::thread);
  EXPECT_EQ(kiln::auto_start(1, 1, 1, 4).share, 1);
}

}  // namespace
