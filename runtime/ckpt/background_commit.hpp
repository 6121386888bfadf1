// The one checkpoint commit that may run beside training (docs/checkpoints.md,
// "Asynchronous commits"): a thread that writes a snapshot already taken, with
// the same protocol as a synchronous commit. At most one is in flight; its
// outcome is read without waiting (at a step's vote) or by waiting (at the
// next checkpoint, the end of fit, max_time, a preemption). No LibTorch here.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace kiln {

class BackgroundCommit {
 public:
  BackgroundCommit() = default;
  // Waits for the commit in flight: a snapshot being written is a complete,
  // consistent checkpoint, so it is finished even when the run is failing.
  ~BackgroundCommit();
  BackgroundCommit(const BackgroundCommit&) = delete;
  BackgroundCommit& operator=(const BackgroundCommit&) = delete;

  // Runs `work` on the commit thread. The previous commit must have been
  // waited for (wait() or a finished poll()); `work` reports failure by
  // throwing, and its message becomes the failure's.
  void start(std::function<void()> work);

  // Whether a commit was started and its outcome not yet taken.
  bool pending() const;
  // Without waiting: the failure of a commit that has ended, taken once;
  // nullopt when none is pending, it is still running, or it succeeded (then
  // it is no longer pending).
  std::optional<std::string> poll();
  // Waits for the pending commit, if any; its failure, taken, or nullopt.
  std::optional<std::string> wait();

 private:
  std::optional<std::string> take_locked();

  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool running_ = false;
  bool pending_ = false;
  std::string failure_;
  std::thread thread_;
};

}  // namespace kiln
