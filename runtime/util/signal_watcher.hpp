// The process's signal policy, set up first thing in main(), before any other
// thread exists:
// - SIGINT, SIGTERM and SIGUSR1 (a preemption notice) are blocked in every
//   thread and taken by one watcher thread with sigtimedwait, which turns them
//   into a flag the loop checks at step boundaries (cleanup runs on the main
//   thread; no async-signal-safety rules, no global state). A second signal
//   exits at once.
// - SIGPIPE is ignored: a closed stdout or stderr (`kiln fit | head`, a `tee`
//   that died of the same Ctrl-C) turns writes into EPIPE errors, which the
//   log sinks drop, instead of killing kiln before its cleanup. Ignored
//   dispositions survive exec, so workers inherit it too.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace kiln {

class SignalWatcher {
 public:
  // The signals it takes (and the process blocks in every thread).
  static constexpr int kWatched[] = {SIGINT, SIGTERM, SIGUSR1};

  SignalWatcher();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // 0 until the first SIGINT/SIGTERM/SIGUSR1, then that signal's number.
  const std::atomic<int>* signal() const { return &signal_; }
  // A worker of kiln's supervisor: the first signal is also told through
  // `fd` (the heartbeat pipe) at once, as "@signal N\n", so that the
  // supervisor never sends a rank that is already stopping on a signal of
  // its own a second one (which would end it without cleanup).
  void announce_to(int fd);

 private:
  void watch();
  void announce(int s);
  static constexpr std::chrono::seconds kSameSignalWindow{2};
  sigset_t set_;
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::atomic<int> announce_fd_{-1};
  std::thread thread_;
};

}  // namespace kiln
