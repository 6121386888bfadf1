// The worker's side of the pipe to kiln's supervisor (KILN_HEARTBEAT_FD).
// Started first thing in a worker process, before the manifest or any plugin
// is loaded, so a slow start (a big plugin on network storage) is never
// mistaken for a hang. Over the pipe go, each in one write():
//   kBeat            one byte a second from a thread of its own: evidence of life;
//   "@phase NAME\n"  the phase the worker entered (loading, rendezvous, ...);
//   "@busy S HOOK\n" the main thread has been inside plugin hook HOOK for S s;
//   "@step N\n"      the optimizer steps done so far, when changed (at most ten a second);
//   "!R REPORT\n"    why the worker fails, R = 1 for a root cause, 0 for an
//                    echo of another rank's failure;
//   "@done\n"        the worker finished its command successfully;
//   "@signal N\n"    the worker got signal N itself and is stopping on it
//                    (util/signal_watcher.hpp writes it, from its thread).
// A worker that exits 0 without "@done" left early. No LibTorch here.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "util/activity.hpp"

namespace kiln {

namespace heartbeat {
// A control character, so it never appears in the text lines that share the pipe.
constexpr char kBeat = '\x06';
}  // namespace heartbeat

class Heartbeat {
 public:
  Heartbeat();  // a no-op without KILN_HEARTBEAT_FD
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }  // the pipe; -1 when not connected
  // The main thread's hook marks, watched by the beat thread.
  Activity* activity() { return &activity_; }
  void phase(const char* name);
  // Tells the supervisor why this worker is failing. `root_cause` is false
  // when the failure only reflects another rank's (a collective that failed
  // because a peer died or hung), so the supervisor reports the peer instead.
  void report_failure(bool root_cause, const std::string& report);
  void done();

 private:
  void send(std::string line);
  void beat();

  int fd_ = -1;
  Activity activity_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kiln
