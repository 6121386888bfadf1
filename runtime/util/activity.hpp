// What the main thread is doing right now, for the heartbeat thread to read:
// the name of the plugin hook it is inside, and a counter that moves on every
// entry and exit. A counter that stands still while a hook name is set means
// the hook has not returned: the heartbeat tells the supervisor, so a hung
// rank is reported as hung (and where), not as the process the supervisor
// later had to kill. Two relaxed atomic stores per hook call; no locks.
#pragma once

#include <atomic>
#include <cstdint>

namespace kiln {

class Activity {
 public:
  struct Snapshot {
    const char* hook;  // nullptr: not inside a hook
    uint64_t moves;
  };

  // `hook` must be a string with static storage (a literal).
  void enter(const char* hook) noexcept {
    hook_.store(hook, std::memory_order_relaxed);
    moves_.fetch_add(1, std::memory_order_relaxed);
  }
  void leave() noexcept {
    hook_.store(nullptr, std::memory_order_relaxed);
    moves_.fetch_add(1, std::memory_order_relaxed);
  }
  Snapshot snapshot() const noexcept {
    return {hook_.load(std::memory_order_relaxed), moves_.load(std::memory_order_relaxed)};
  }
  // The optimizer steps done so far: the supervisor names the step a rank
  // failed at, and a restart logs it. One relaxed store per step.
  void at_step(int64_t global_step) noexcept { step_.store(global_step, std::memory_order_relaxed); }
  int64_t step() const noexcept { return step_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> step_{-1};
  std::atomic<const char*> hook_{nullptr};
  std::atomic<uint64_t> moves_{0};
};

// Marks one hook call; a null Activity marks nothing.
class InHook {
 public:
  InHook(Activity* activity, const char* hook) noexcept : activity_(activity) {
    if (activity_) activity_->enter(hook);
  }
  ~InHook() {
    if (activity_) activity_->leave();
  }
  InHook(const InHook&) = delete;
  InHook& operator=(const InHook&) = delete;

 private:
  Activity* activity_;
};

}  // namespace kiln
