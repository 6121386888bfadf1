#include "dist/supervisor.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

// The heartbeat byte: a control character, so it never appears in the
// failure line that shares the pipe.
constexpr char kBeat = '\x06';
constexpr int kPreemptedExit = 75;  // kiln::kExitPreempted

// A free TCP port on the loopback interface, as torchrun picks one. Another
// process could take it before rank 0 binds it; the rendezvous then fails
// with a clear error rather than hanging.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  int heartbeat = -1;  // read end: kBeat bytes, then at most one failure line
  Clock::time_point last_beat;
  bool running = false;
  std::string message;  // what came through the pipe besides beats
};

// A failure the supervisor saw; root causes are reported before failures
// that only echo another rank's.
struct Observed {
  int rank;
  std::string cause;
  int code;
  bool root;
};

// The failure line a worker sent: "!<0|1> <report>\n", 1 for a root cause.
bool parse_report(const std::string& message, bool* root, std::string* report) {
  const size_t at = message.find('!');
  if (at == std::string::npos || at + 2 >= message.size()) return false;
  *root = message[at + 1] == '1';
  *report = message.substr(at + 3);
  while (!report->empty() && (report->back() == '\n' || report->back() == '\r')) report->pop_back();
  return true;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return std::string("was killed by SIG") + (name ? name : std::to_string(s).c_str());
  }
  return "ended (status " + std::to_string(status) + ")";
}

pid_t spawn(const SupervisorOptions& options, int rank, int port, const std::string& run_id, int heartbeat_write) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid > 0) return pid;
  // Child: die with the supervisor, whatever kills it, so no worker outlives the run.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Its own process group: a Ctrl-C on the terminal reaches the supervisor
  // only, which then stops the workers once, in order.
  ::setpgid(0, 0);
  if (::getppid() == 1) ::_exit(1);
  sigset_t none;
  sigemptyset(&none);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);  // the supervisor blocks SIGINT/SIGTERM; workers must not
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(options.processes).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.processes).c_str(), 1);
  ::setenv("GROUP_RANK", "0", 1);
  ::setenv("MASTER_ADDR", options.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TORCHELASTIC_RUN_ID", run_id.c_str(), 1);
  ::setenv("KILN_LAUNCHED_BY_KILN", "1", 1);
  ::setenv("KILN_HEARTBEAT_FD", std::to_string(heartbeat_write).c_str(), 1);
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "kiln: error: cannot start worker %d: %s\n", rank, std::strerror(errno));
  ::_exit(127);
}

}  // namespace

SupervisorResult supervise(const SupervisorOptions& options, const std::atomic<int>* signal) {
  const int port = options.master_port > 0 ? options.master_port : free_port();
  const std::string run_id = std::to_string(::getpid()) + "-" + std::to_string(port);
  spdlog::info("starting {} worker processes (rendezvous {}:{})", options.processes, options.master_addr, port);

  std::vector<Worker> workers(options.processes);
  for (int r = 0; r < options.processes; ++r) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    // The write end must survive exec in the child only.
    ::fcntl(pipe_fds[1], F_SETFD, 0);
    workers[r].rank = r;
    workers[r].pid = spawn(options, r, port, run_id, pipe_fds[1]);
    ::close(pipe_fds[1]);
    ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
    workers[r].heartbeat = pipe_fds[0];
    workers[r].last_beat = Clock::now();
    workers[r].running = true;
  }

  SupervisorResult result;
  std::vector<Observed> failures;
  std::string preempted;  // a worker's report, when the workers were preempted
  bool stopping = false;
  Clock::time_point kill_at{};
  int running = options.processes;
  // `forward` is the signal the workers get: SIGTERM, or the preemption
  // signal the supervisor itself received, so workers can checkpoint.
  auto stop_all = [&](const std::string& why, int forward = SIGTERM) {
    if (stopping) return;
    stopping = true;
    kill_at = Clock::now() + options.grace;
    spdlog::warn("{}; stopping the workers (SIG{}, SIGKILL after {} s)", why, sigabbrev_np(forward),
                 std::chrono::duration<double>(options.grace).count());
    for (auto& w : workers)
      if (w.running) ::kill(w.pid, forward);
  };
  auto fail = [&](const Worker& w, const std::string& cause, int code, bool root) {
    const std::string who = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") ";
    failures.push_back({w.rank, who + cause, code, root});
    stop_all("rank " + std::to_string(w.rank) + " " + cause);
  };

  std::vector<pollfd> fds(workers.size());
  while (running > 0) {
    for (size_t i = 0; i < workers.size(); ++i)
      fds[i] = pollfd{workers[i].running ? workers[i].heartbeat : -1, POLLIN, 0};
    ::poll(fds.data(), fds.size(), 50);
    const auto now = Clock::now();
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!workers[i].running || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buffer[4096];
      const ssize_t n = ::read(workers[i].heartbeat, buffer, sizeof buffer);
      if (n > 0) {
        workers[i].last_beat = now;
        for (ssize_t k = 0; k < n; ++k)
          if (buffer[k] != kBeat) workers[i].message += buffer[k];
      }
    }
    // Reap whoever ended. Deaths by a signal come first within one sweep: a
    // killed rank is the cause, the peers that then failed their collective
    // are the effect.
    std::vector<std::pair<Worker*, int>> ended;
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (auto& w : workers)
        if (w.pid == pid && w.running) ended.emplace_back(&w, status);
    }
    std::stable_sort(ended.begin(), ended.end(),
                     [](const auto& a, const auto& b) { return WIFSIGNALED(a.second) && !WIFSIGNALED(b.second); });
    for (auto& [w, status] : ended) {
      // Drain what the worker wrote last (its failure line).
      char buffer[4096];
      for (ssize_t n; (n = ::read(w->heartbeat, buffer, sizeof buffer)) > 0;)
        for (ssize_t k = 0; k < n; ++k)
          if (buffer[k] != kBeat) w->message += buffer[k];
      w->running = false;
      --running;
      ::close(w->heartbeat);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (WIFEXITED(status) && WEXITSTATUS(status) == kPreemptedExit) {
        // Preempted: every rank agreed, a checkpoint was committed. Not a failure.
        bool root = true;
        std::string report;
        if (preempted.empty()) preempted = parse_report(w->message, &root, &report) ? report : "preempted";
        continue;
      }
      bool root = true;
      std::string report;
      std::string cause = describe_status(status);
      if (parse_report(w->message, &root, &report)) cause += ": " + report;
      const int code = WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1;
      if (stopping && !root) {
        spdlog::debug("rank {} {}", w->rank, cause);
        continue;
      }
      fail(*w, cause, code, root);
    }
    if (!stopping) {
      if (const int s = signal ? signal->load() : 0) {
        const std::string why = std::string("interrupted by SIG") + sigabbrev_np(s);
        failures.push_back({-1, why, 130, true});
        stop_all(why, s == SIGINT ? SIGTERM : s);
      }
      for (auto& w : workers) {
        if (w.running && now - w.last_beat > options.heartbeat_timeout) {
          // A stopped process ignores SIGTERM until continued: SIGKILL it.
          ::kill(w.pid, SIGKILL);
          fail(w, "stopped responding (no heartbeat for " +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - w.last_beat).count()) +
                      " s)", 1, true);
        }
      }
    } else if (now >= kill_at) {
      for (auto& w : workers)
        if (w.running) ::kill(w.pid, SIGKILL);
    }
  }
  // Preempted workers and no failure but the signal that caused it: the run
  // was preempted, not failed.
  const bool only_signal = std::all_of(failures.begin(), failures.end(), [](const Observed& f) { return f.rank < 0; });
  if (!preempted.empty() && only_signal) {
    result.exit_code = kPreemptedExit;
    result.report = preempted;
    return result;
  }
  // The first root cause, else the first failure of any kind.
  const Observed* chosen = nullptr;
  for (const auto& f : failures)
    if (f.root) {
      chosen = &f;
      break;
    }
  if (!chosen && !failures.empty()) chosen = &failures.front();
  if (chosen) {
    result.exit_code = chosen->code;
    result.report = chosen->cause;
  }
  return result;
}

Heartbeat::Heartbeat() {
  const char* fd = std::getenv("KILN_HEARTBEAT_FD");
  if (fd == nullptr) return;
  fd_ = std::atoi(fd);
  ::fcntl(fd_, F_SETFD, FD_CLOEXEC);
  thread_ = std::thread([this] {
    while (!done_) {
      const char beat = kBeat;
      if (::write(fd_, &beat, 1) < 0 && errno == EPIPE) return;
      for (int i = 0; i < 10 && !done_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

void Heartbeat::report_failure(bool root_cause, const std::string& report) {
  if (fd_ < 0) return;
  std::string line = std::string("!") + (root_cause ? "1 " : "0 ") + report + "\n";
  // One write: the pipe keeps it whole next to the beat thread's bytes.
  if (line.size() > PIPE_BUF) line = line.substr(0, PIPE_BUF - 1) + "\n";
  (void)!::write(fd_, line.data(), line.size());
}

Heartbeat::~Heartbeat() {
  done_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln
