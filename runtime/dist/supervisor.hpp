// kiln's own launcher: starts N worker processes of this executable on this
// machine, each told its place through the torchrun variables, and is the
// single authority on failure. When a worker exits non-zero, dies by a signal
// or stops responding (no heartbeat: SIGSTOP, a deadlock), every other worker
// gets SIGTERM (it runs its cleanup), then SIGKILL after a grace period; every
// process is reaped and the first failure is reported. No LibTorch here.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace kiln {

struct SupervisorOptions {
  int processes = 2;
  std::vector<std::string> argv;  // the worker command line (this executable, same arguments)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: pick a free port
  std::chrono::milliseconds heartbeat_timeout{60000};  // a silent worker counts as hung after this
  std::chrono::milliseconds grace{10000};              // SIGTERM -> SIGKILL
};

struct SupervisorResult {
  int exit_code = 0;        // 0, or the exit code kiln returns
  std::string report;       // one line naming the first failing rank and its cause; empty on success
};

// Runs the workers to completion. `signal` is the supervisor's own
// SIGINT/SIGTERM flag: when set, workers are stopped as on a failure.
SupervisorResult supervise(const SupervisorOptions& options, const std::atomic<int>* signal);

// Worker side: starts a thread that writes one byte a second to the
// heartbeat pipe the supervisor passed in KILN_HEARTBEAT_FD (no-op without
// it). The beat stops when the process is stopped or hangs in a way that
// stops all threads; it is the supervisor's evidence of life.
class Heartbeat {
 public:
  Heartbeat();
  ~Heartbeat();
  // Tells the supervisor why this worker is failing. `root_cause` is false
  // when the failure only reflects another rank's (a collective that failed
  // because a peer died or hung), so the supervisor reports the peer instead.
  void report_failure(bool root_cause, const std::string& report);
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  int fd_ = -1;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace kiln
