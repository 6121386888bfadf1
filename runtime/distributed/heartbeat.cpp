#include "distributed/heartbeat.hpp"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

namespace kiln {

namespace {
// A hook that has not returned for this long is worth telling the supervisor
// about (a training step of several seconds is legal; the report only names
// where the rank is, it accuses nobody).
constexpr int kBusyAfterSeconds = 2;
}  // namespace

Heartbeat::Heartbeat() {
  const char* fd = std::getenv("KILN_HEARTBEAT_FD");
  if (fd == nullptr || *fd == '\0') return;
  fd_ = std::atoi(fd);
  if (::fcntl(fd_, F_SETFD, FD_CLOEXEC) != 0) {  // not an open descriptor: no supervisor to talk to
    fd_ = -1;
    return;
  }
  thread_ = std::thread([this] { beat(); });
}

Heartbeat::~Heartbeat() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void Heartbeat::send(std::string line) {
  if (fd_ < 0) return;
  // One write of at most PIPE_BUF bytes: the pipe keeps it whole next to the
  // beat thread's bytes. A supervisor that went away (EPIPE; SIGPIPE is
  // ignored) is not this worker's failure.
  if (line.size() > PIPE_BUF) line = line.substr(0, PIPE_BUF - 1) + "\n";
  while (::write(fd_, line.data(), line.size()) < 0 && errno == EINTR) {
  }
}

void Heartbeat::phase(const char* name) { send(std::string("@phase ") + name + "\n"); }

void Heartbeat::report_failure(bool root_cause, const std::string& report) {
  std::string one_line = report;
  for (char& c : one_line)
    if (c == '\n' || c == '\r') c = ' ';
  send(std::string("!") + (root_cause ? "1 " : "0 ") + one_line + "\n");
}

void Heartbeat::done() { send("@done\n"); }

void Heartbeat::beat() {
  using Clock = std::chrono::steady_clock;
  Activity::Snapshot last = activity_.snapshot();
  Clock::time_point still_since = Clock::now();
  int64_t step_sent = -1;
  while (!stopping_) {
    const char beat = heartbeat::kBeat;
    if (::write(fd_, &beat, 1) < 0 && errno == EPIPE) return;
    const Activity::Snapshot now = activity_.snapshot();
    if (now.moves != last.moves || now.hook == nullptr) {
      last = now;
      still_since = Clock::now();
    } else {
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - still_since).count();
      if (seconds >= kBusyAfterSeconds) send("@busy " + std::to_string(seconds) + " " + now.hook + "\n");
    }
    // The step, when it moved, every tenth of a second: a rank killed soon
    // after a restart is still named with the step it reached.
    for (int i = 0; i < 10 && !stopping_; ++i) {
      if (const int64_t step = activity_.step(); step != step_sent) {
        send("@step " + std::to_string(step) + "\n");
        step_sent = step;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace kiln
