// trainer.data_workers = "auto" (data/data_workers.hpp): how training batches reach the step, chosen by
// measuring. A prefetch thread gathers the next batch while the step runs,
// but every batch then crosses threads (a hand-off, a wake-up, memory
// allocated on one thread and freed on another), and on a machine whose
// cores the step's intra-op threads already fill, the thread takes its time
// from them. Gathering inline on the main thread costs the gather itself and
// nothing else. Which is faster depends on the gather's cost against the
// step's, on the cores left over and on the machine's load, so no fixed rule
// is right: early in the first epoch a trial times the steps of both, in
// windows ordered A B B A (so a steady drift in speed favours neither), and
// keeps the faster for the rest of the run. A mode far slower than the
// other ends the trial early (FetchTrial::clear_early): its windows are
// what the trial costs.
//
// This class is the trial's bookkeeping only (no threads, no clocks): the
// batch stream (data/sampled_batches.cpp) asks it what to run next and
// tells it what each timed step took.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

enum class FetchMode { thread, inline_ };
const char* fetch_mode_name(FetchMode mode);

// The cores this process may run on (its CPU affinity; all online CPUs when
// that cannot be read).
int usable_cores();

// The mode to use where nothing was measured: a prefetch thread only when
// the prefetch threads fit beside the intra-op threads in `cores`.
FetchMode unmeasured_mode(int intra_op_threads, int prefetch_threads, int cores);

// How `auto` starts on the CPU, before anything is measured:
//   - the intra-op threads fill this rank's share of the cores (cores /
//     ranks): inline, no trial (a prefetch thread could only take time from
//     them);
//   - else, with several processes: unmeasured_mode over the share (a rank
//     cannot time itself alone);
//   - else (one process, a core left over): the trial.
struct AutoStart {
  enum class Kind { inline_, thread, trial } kind;
  int share;  // the cores this rank counts as its own
};
AutoStart auto_start(int intra_op_threads, int prefetch_threads, int cores, int world_size);

// The trial's length (outside the class: a default argument of its own
// class cannot use its member initializers).
struct FetchTrialShape {
  size_t warmup = 8;            // untimed batches at the start of each epoch the trial runs in
  size_t window = 16;           // batches per window: the first step and the last are not timed
  size_t windows_per_mode = 4;  // windows of each mode
};

class FetchTrial {
 public:
  using Shape = FetchTrialShape;
  // Without a decision, the streams use `fallback`.
  explicit FetchTrial(FetchMode fallback, Shape shape = {});

  // A stretch of batches fetched one way: timed (a trial window) or not.
  struct Segment {
    FetchMode mode;
    size_t length;
    bool timed;
  };
  // What a stream runs next, `into` batches into its epoch with `left`
  // batches left: warm-up, the next window if the rest of the epoch holds
  // it, else the rest of the epoch in the mode in force.
  Segment next_segment(size_t into, size_t left) const;

  // A timed window ended: the duration (seconds) of each timed step.
  void record(FetchMode mode, const std::vector<double>& step_seconds);

  bool running() const { return !decided_.has_value(); }
  // The decision, once every window ran; else the fallback.
  FetchMode mode() const { return decided_.value_or(fallback_); }
  // One line on the decision (for the log), empty before it.
  const std::string& verdict() const { return verdict_; }

  // A mode's cost: the mean step time without its slowest eighth (a step
  // that waited for a checkpoint or a validation says nothing about the
  // fetching; a cost every few steps, such as a wake-up, stays counted).
  static double trimmed_mean(std::vector<double> seconds);

 private:
  FetchMode window_mode(size_t index) const;
  // Whether the windows so far already settle it (one mode far slower).
  bool clear_early(double inline_cost, double thread_cost) const;

  FetchMode fallback_;
  Shape shape_;
  size_t windows_done_ = 0;
  std::vector<double> steps_[2];  // per mode: the timed steps' seconds
  std::optional<FetchMode> decided_;
  std::string verdict_;
};

}  // namespace kiln
