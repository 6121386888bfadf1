#include "util/signal_watcher.hpp"

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "util/errors.hpp"

namespace kiln {

SignalWatcher::SignalWatcher() {
  ::signal(SIGPIPE, SIG_IGN);
  sigemptyset(&set_);
  for (const int s : kWatched) sigaddset(&set_, s);  // SIGUSR1: a preemption notice, when the manifest says so
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any other thread exists
  thread_ = std::thread([this] { watch(); });
}

SignalWatcher::~SignalWatcher() {
  done_ = true;
  thread_.join();
}

void SignalWatcher::watch() {
  const timespec tick{0, 100'000'000};
  std::chrono::steady_clock::time_point first_at;
  while (!done_) {
    const int s = sigtimedwait(&set_, nullptr, &tick);
    if (s <= 0) continue;
    // A worker of kiln's supervisor that gets its first signal twice at
    // once (`pkill kiln`, SLURM signalling every process of a step: the
    // signal itself, then the supervisor's forward of it) takes the copy
    // as the same signal, not as "exit now": the supervisor never sends a
    // second one itself (it escalates with SIGKILL).
    if (announce_fd_.load() >= 0 && signal_.load() == s &&
        std::chrono::steady_clock::now() - first_at < kSameSignalWindow) {
      std::fputs("kiln: the same signal again at once (the launcher's forward of it): taken as one\n", stderr);
      continue;
    }
    if (signal_.load() == 0) first_at = std::chrono::steady_clock::now();
    if (signal_.exchange(s) != 0) {
      std::fputs("kiln: second signal, exiting without cleanup\n", stderr);
      _exit(kExitInterrupted);
    }
    announce(s);
    std::fprintf(stderr, "\nkiln: %s received; stopping after the current step (send again to exit now)\n",
                 s == SIGTERM ? "SIGTERM" : s == SIGUSR1 ? "SIGUSR1" : "SIGINT");
  }
}

void SignalWatcher::announce_to(int fd) {
  announce_fd_ = fd;
  if (const int s = signal_.load(); s != 0) announce(s);  // one that came first
}

void SignalWatcher::announce(int s) {
  const int fd = announce_fd_.load();
  if (fd < 0) return;
  char line[32];
  const int n = std::snprintf(line, sizeof line, "@signal %d\n", s);
  while (::write(fd, line, static_cast<size_t>(n)) < 0 && errno == EINTR) {
  }
}

}  // namespace kiln
