// [profiler]: where a fit's time goes, by phase (docs/profiling.md).
//
// The main thread opens and closes phases (ProfileScope); a phase's time is
// its own, less the phases nested in it, so the phases and "other" (the loop
// itself) add up to the fit's wall time exactly. `trace` also keeps every
// phase as a Chrome trace event, and the data workers' get_batch calls on
// their own tracks, written per rank as trace.rank<N>.json.
//
// Host time: on a GPU the step only queues kernels, and their time shows
// where the host waits for them (a loss read at a log point, a copy back).
//
// No LibTorch here (kiln_core).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/options.hpp"

namespace kiln {

enum class Phase : uint8_t {
  get_batch_wait,  // the main thread waiting for (or making) the next batch
  host_to_device,  // the batch's copy to the device (a GPU run)
  training_step,   // the model's training_step (forward and loss)
  backward,        // loss.backward(), the gradient all-reduce's own time excepted
  allreduce_wait,  // waiting in the gradient all-reduce (several processes)
  gather_wait,     // waiting for sharded parameters to be gathered (distributed.shard = "parameters")
  optimizer_step,  // clipping, the optimizer, dropping the gradients, the schedule
  validation,      // validation passes inside the fit (and the sanity check)
  callbacks,       // the callbacks' hooks
  checkpoint,      // committing checkpoints (and waiting for an asynchronous one)
  logging,         // metrics reduced and logged, progress lines
  count
};
const char* phase_name(Phase phase);

class Profiler {
 public:
  using Clock = std::chrono::steady_clock;

  Profiler(ProfilerKind kind, int32_t rank);

  bool tracing() const { return kind_ == ProfilerKind::trace; }

  // The fit: the root of every phase (main thread).
  void begin_fit();
  void end_fit();
  // Whether the fit began and has not ended (a failure cut it short).
  bool in_fit() const { return in_fit_; }
  // A phase on the main thread; phases nest.
  void begin(Phase phase);
  void end(Phase phase);
  // Time the innermost open phase spent in `phase` without a span of its
  // own to show (the shared-memory all-reduce's waits inside backward, in
  // total): moved from the open phase to `phase`, and shown in a trace as
  // one event at its end.
  void carve(Phase phase, double seconds, int64_t count);
  // Any thread but the main one: one call on its own track ("data worker N").
  void worker_event(const char* name, Clock::time_point start, Clock::time_point end);

  struct Totals {
    double wall_s = 0;                                 // the fit
    std::array<double, size_t(Phase::count)> self_s{};  // each phase's own time
    std::array<int64_t, size_t(Phase::count)> count{};
  };
  const Totals& totals() const { return totals_; }
  // One line of text per rank, for a gather; parse_totals reads it back.
  std::string export_totals() const;
  static Totals parse_totals(const std::string& text);
  // The table rank 0 prints: the slowest rank's phases (by wall time), with
  // each phase's spread over the ranks when there are several.
  static std::string table(const std::vector<Totals>& ranks);

  // trace: the Chrome trace-event JSON of this rank.
  std::string trace_json() const;
  // trace: writes trace_json() to <dir>/trace.rank<N>.json; returns the path.
  std::filesystem::path write_trace(const std::filesystem::path& dir) const;

 private:
  struct Open {
    Phase phase;
    Clock::time_point start;
    double nested_s = 0;
  };
  struct Event {
    int16_t name;  // a Phase, or kFit / kWorkerNames + index
    uint16_t track;
    int64_t start_ns, dur_ns;
  };
  static constexpr int16_t kFit = 100;
  static constexpr size_t kMaxEvents = size_t{4} << 20;  // ~100 MiB of trace at most

  int64_t since_start_ns(Clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - started_).count();
  }
  void keep(int16_t name, uint16_t track, Clock::time_point start, Clock::time_point end);

  ProfilerKind kind_;
  int32_t rank_;
  Clock::time_point started_ = Clock::now();
  Clock::time_point fit_start_{};
  bool in_fit_ = false;
  double fit_nested_s_ = 0;
  std::vector<Open> open_;
  Totals totals_;
  // trace
  mutable std::mutex mutex_;  // events_ and tracks_ (worker threads append)
  std::vector<Event> events_;
  std::vector<std::string> worker_names_;
  std::map<std::thread::id, uint16_t> tracks_;
  bool dropped_ = false;
};

// A phase for the scope's life; a null profiler costs one test.
class ProfileScope {
 public:
  ProfileScope(Profiler* profiler, Phase phase) : profiler_(profiler), phase_(phase) {
    if (profiler_) profiler_->begin(phase_);
  }
  ~ProfileScope() {
    if (profiler_) profiler_->end(phase_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* profiler_;
  Phase phase_;
};

}  // namespace kiln
