#include "data/fetch_trial.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

namespace kiln {

const char* fetch_mode_name(FetchMode mode) { return mode == FetchMode::thread ? "thread" : "inline"; }

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

FetchMode unmeasured_mode(int intra_op_threads, int prefetch_threads, int cores) {
  return intra_op_threads + std::max(1, prefetch_threads) <= cores ? FetchMode::thread : FetchMode::inline_;
}

AutoStart auto_start(int intra_op_threads, int prefetch_threads, int cores, int world_size) {
  const int ranks = std::max(1, world_size);
  const int share = std::max(1, cores / ranks);
  if (intra_op_threads >= share) return {AutoStart::Kind::inline_, share};
  if (ranks > 1)
    return {unmeasured_mode(intra_op_threads, prefetch_threads, share) == FetchMode::thread ? AutoStart::Kind::thread
                                                                                             : AutoStart::Kind::inline_,
            share};
  return {AutoStart::Kind::trial, share};
}

FetchTrial::FetchTrial(FetchMode fallback, Shape shape) : fallback_(fallback), shape_(shape) {
  shape_.window = std::max<size_t>(shape_.window, 3);  // at least one timed step
  shape_.windows_per_mode = std::max<size_t>(shape_.windows_per_mode, 1);
}

FetchMode FetchTrial::window_mode(size_t index) const {
  // A B B A A B B A ...: inline, thread, thread, inline, ...
  return ((index + 1) / 2) % 2 == 0 ? FetchMode::inline_ : FetchMode::thread;
}

FetchTrial::Segment FetchTrial::next_segment(size_t into, size_t left) const {
  if (decided_) return {*decided_, left, false};
  if (into < shape_.warmup) return {fallback_, std::min(shape_.warmup - into, left), false};
  if (shape_.window <= left) return {window_mode(windows_done_), shape_.window, true};
  return {fallback_, left, false};  // the trial goes on in the next epoch
}

double FetchTrial::trimmed_mean(std::vector<double> seconds) {
  if (seconds.empty()) return 0.0;
  std::sort(seconds.begin(), seconds.end());
  const size_t keep = seconds.size() - seconds.size() / 8;
  return std::accumulate(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(keep), 0.0) /
         static_cast<double>(keep);
}

// A mode that loses by far loses whatever the drift: a prefetch thread
// beside an intra-op team that fills the cores made each of mlp32's steps
// 2-4x slower, and the whole trial cost ~0.1 s of a 0.27 s epoch. So the
// trial stops after the first pair of windows at 2x, and after each A B B A
// (a drift favours neither) at 1.25x; a closer call runs every window.
bool FetchTrial::clear_early(double inline_cost, double thread_cost) const {
  if (steps_[0].empty() || steps_[1].empty()) return false;
  const double ratio = std::max(inline_cost, thread_cost) / std::max(std::min(inline_cost, thread_cost), 1e-12);
  if (windows_done_ == 2) return ratio >= 2.0;
  return windows_done_ % 4 == 0 && ratio >= 1.25;
}

void FetchTrial::record(FetchMode mode, const std::vector<double>& step_seconds) {
  if (decided_) return;
  auto& steps = steps_[mode == FetchMode::thread ? 1 : 0];
  steps.insert(steps.end(), step_seconds.begin(), step_seconds.end());
  ++windows_done_;
  const double inline_cost = trimmed_mean(steps_[0]);
  const double thread_cost = trimmed_mean(steps_[1]);
  if (windows_done_ < 2 * shape_.windows_per_mode && !clear_early(inline_cost, thread_cost)) return;
  // Equal (or nothing timed): inline, which holds no thread and no batches ahead.
  decided_ = !steps_[1].empty() && !steps_[0].empty() && thread_cost < inline_cost ? FetchMode::thread
                                                                                    : FetchMode::inline_;
  char line[256];
  std::snprintf(line, sizeof line,
                "trainer.data_workers = auto: get_batch %s (a step took %.0f us with get_batch inline, %.0f us with "
                "worker threads; %zu steps timed)",
                *decided_ == FetchMode::thread ? "on worker threads" : "inline", inline_cost * 1e6,
                thread_cost * 1e6, steps_[0].size() + steps_[1].size());
  verdict_ = line;
  steps_[0].clear();
  steps_[1].clear();
}

}  // namespace kiln
