// kiln's own launcher: starts N worker processes of this executable on this
// machine, each told its place through the torchrun variables, and is the
// single authority on failure. When a worker exits non-zero, dies by a signal
// or stops responding (no heartbeat: SIGSTOP, a deadlock), every other worker
// gets SIGTERM (it runs its cleanup), then SIGKILL after a grace period; every
// process is reaped and the first real failure is reported: a worker's own
// root cause, a worker that hung (and where), stopped responding, never
// started, or exited early with code 0 while the others ran. The
// supervisor's own SIGTERM/SIGKILL are never reported as causes. Workers talk
// back through dist/heartbeat.hpp. No LibTorch here.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

namespace kiln {

struct SupervisorOptions {
  int processes = 2;
  std::vector<std::string> argv;  // the worker command line (this executable, same arguments)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: pick a free port
  // From fork to a worker's first heartbeat (exec, loading LibTorch): a
  // phase of its own, so a slow start is not taken for a hang.
  std::chrono::milliseconds startup_timeout{60000};
  std::chrono::milliseconds heartbeat_timeout{60000};  // then a silent worker counts as hung after this
  std::chrono::milliseconds grace{10000};              // SIGTERM -> SIGKILL
  std::vector<std::pair<std::string, std::string>> env;  // set for every worker (e.g. the run directory's lock)
};

struct SupervisorResult {
  int exit_code = 0;        // 0, or the exit code kiln returns
  std::string report;       // one line naming the first failing rank and its cause; empty on success
  // Of the failure reported: the rank (-1: the supervisor's own signal), the
  // phase that rank was in ("start-up agreement", "fit", ...) and whether it
  // said why itself (a rank killed by a signal did not). A restart is
  // decided on these (distributed/restarts.hpp).
  int rank = -1;
  std::string phase;
  bool reported = false;
};

// Runs the workers to completion. `signal` is the supervisor's own
// SIGINT/SIGTERM/SIGUSR1 flag: when set, the workers get that very signal
// (SIGINT stays an interruption, the manifest's preemption signal a
// preemption: each rank decides, as a single process would) and are stopped
// as on a failure unless they all end preempted.
SupervisorResult supervise(const SupervisorOptions& options, const std::atomic<int>* signal);

}  // namespace kiln
