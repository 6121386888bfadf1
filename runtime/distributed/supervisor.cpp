#include "distributed/supervisor.hpp"

#include "distributed/heartbeat.hpp"

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

constexpr int kPreemptedExit = 75;     // kiln::kExitPreempted
constexpr int kInterruptedExit = 130;  // kiln::kExitInterrupted

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
  int heartbeat = -1;  // read end: beats and lines (dist/heartbeat.hpp)
  Clock::time_point spawned, last_beat;
  bool alive_seen = false;  // a first beat arrived: start-up is over
  bool running = false;
  std::string partial;      // an incomplete line
  std::string phase = "start-up";
  std::string busy_hook;    // the hook the main thread has been inside, if any
  int64_t step = -1;        // optimizer steps done, as it last said
  int64_t busy_seconds = 0;
  bool done = false;        // said "@done": finished its command
  int signalled = 0;        // said "@signal N": got signal N itself, and is stopping on it
  bool has_report = false;
  bool report_root = true;
  std::string report;       // its own failure line
  bool terminated = false;  // the supervisor sent it SIGTERM (or the forwarded signal)
  bool own_signal = false;  // when the supervisor stopped the run, it was already stopping on a signal of its own
  bool killed = false;      // the supervisor sent it SIGKILL
  bool accounted = false;   // its failure is already recorded (hung, never started)
};

// A failure the supervisor saw; root causes are reported before failures
// that only echo another rank's.
struct Observed {
  int rank;
  std::string cause;
  int code;
  bool root;
  std::string phase;     // the failing worker's phase then
  bool reported = false;  // the worker said why itself
};

// Takes what came through a worker's pipe: beats refresh its clock, lines
// update what the supervisor knows of it.
void take_bytes(Worker& w, const char* data, ssize_t n, Clock::time_point now) {
  if (n <= 0) return;
  w.last_beat = now;
  w.alive_seen = true;
  for (ssize_t k = 0; k < n; ++k) {
    const char c = data[k];
    if (c == heartbeat::kBeat) continue;
    if (c != '\n') {
      w.partial += c;
      continue;
    }
    const std::string line = std::move(w.partial);
    w.partial.clear();
    if (line.rfind("!", 0) == 0 && line.size() >= 3) {
      w.has_report = true;
      w.report_root = line[1] == '1';
      w.report = line.substr(3);
    } else if (line.rfind("@phase ", 0) == 0) {
      w.phase = line.substr(7);
      w.busy_hook.clear();
    } else if (line.rfind("@busy ", 0) == 0) {
      const size_t space = line.find(' ', 6);
      if (space == std::string::npos) continue;
      w.busy_seconds = std::atoll(line.substr(6, space - 6).c_str());
      w.busy_hook = line.substr(space + 1);
    } else if (line.rfind("@step ", 0) == 0) {
      w.step = std::atoll(line.c_str() + 6);
    } else if (line == "@done") {
      w.done = true;
    } else if (line.rfind("@signal ", 0) == 0) {
      w.signalled = std::atoi(line.c_str() + 8);
    }
  }
}

void drain(Worker& w, Clock::time_point now) {
  char buffer[4096];
  for (ssize_t n; (n = ::read(w.heartbeat, buffer, sizeof buffer)) > 0;) take_bytes(w, buffer, n, now);
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

int64_t seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::seconds>(b - a).count();
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
  // SIGINT, SIGTERM and SIGUSR1 stay blocked across exec where the
  // supervisor blocks them (kiln's signal watcher does; every other signal
  // is unblocked): one forwarded while the worker still loads LibTorch stays
  // pending until the worker's own watcher takes it, first thing in main(),
  // instead of killing it by the default action before it could say
  // interrupted or preempted.
  sigset_t inherited, watched;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &inherited);
  sigemptyset(&watched);
  for (const int s : {SIGINT, SIGTERM, SIGUSR1})
    if (sigismember(&inherited, s) == 1) sigaddset(&watched, s);
  ::pthread_sigmask(SIG_SETMASK, &watched, nullptr);
  for (const auto& [name, value] : options.env) ::setenv(name.c_str(), value.c_str(), 1);
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

std::string who(const Worker& w) {
  return "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") ";
}

// One run of the workers: what the supervisor knows of each, the failures it
// saw, and whether it is stopping them.
class Supervision {
 public:
  Supervision(const SupervisorOptions& options, const std::atomic<int>* signal)
      : options_(options), signal_(signal), workers_(options.processes), fds_(workers_.size()) {}

  void start(int port, const std::string& run_id);
  bool any_running() const { return running_ > 0; }
  void step();
  SupervisorResult outcome() const;

 private:
  void read_heartbeats(Clock::time_point now);
  void reap(Clock::time_point now);
  void on_ended(Worker& w, int status, Clock::time_point now);
  void on_exited_zero(Worker& w);
  void on_preempted(const Worker& w);
  void on_interrupted(Worker& w, int status);
  void on_killed(Worker& w);
  void on_failed(Worker& w, int status, int code);
  void take_signal();
  void check_liveness(Clock::time_point now);
  void stop_all(const std::string& why, int forward = SIGTERM);
  void fail(Worker& w, const std::string& cause, int code, bool root);
  void kill_now(Worker& w);

  const SupervisorOptions& options_;
  const std::atomic<int>* signal_;
  std::vector<Worker> workers_;
  std::vector<pollfd> fds_;
  std::vector<Observed> failures_;
  // The workers' reports when they were preempted: rank 0's names the
  // checkpoint it committed, so it is the one told, whichever rank ends first.
  std::string preempted_;
  int preempted_rank_ = -1;
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  int running_ = 0;
};

void Supervision::start(int port, const std::string& run_id) {
  for (int r = 0; r < options_.processes; ++r) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    // The write end must survive exec in the child only.
    ::fcntl(pipe_fds[1], F_SETFD, 0);
    Worker& w = workers_[r];
    w.rank = r;
    w.pid = spawn(options_, r, port, run_id, pipe_fds[1]);
    ::close(pipe_fds[1]);
    ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
    w.heartbeat = pipe_fds[0];
    w.spawned = w.last_beat = Clock::now();
    w.running = true;
  }
  running_ = options_.processes;
}

// One turn of the watch: what the workers said, who ended, then the signal,
// the timeouts or, once stopping, the grace period.
void Supervision::step() {
  for (size_t i = 0; i < workers_.size(); ++i)
    fds_[i] = pollfd{workers_[i].running ? workers_[i].heartbeat : -1, POLLIN, 0};
  ::poll(fds_.data(), fds_.size(), 50);
  const auto now = Clock::now();
  read_heartbeats(now);
  reap(now);
  if (stopping_) {
    if (now >= kill_at_)
      for (auto& w : workers_)
        if (w.running && !w.killed) kill_now(w);
    return;
  }
  take_signal();
  check_liveness(now);
}

void Supervision::read_heartbeats(Clock::time_point now) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (!workers_[i].running || !(fds_[i].revents & (POLLIN | POLLHUP))) continue;
    char buffer[4096];
    take_bytes(workers_[i], buffer, ::read(workers_[i].heartbeat, buffer, sizeof buffer), now);
  }
}

// Deaths by a signal come first within one sweep: a killed rank is the
// cause, the peers that then failed their collective are the effect.
void Supervision::reap(Clock::time_point now) {
  std::vector<std::pair<Worker*, int>> ended;
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (auto& w : workers_)
      if (w.pid == pid && w.running) ended.emplace_back(&w, status);
  }
  std::stable_sort(ended.begin(), ended.end(),
                   [](const auto& a, const auto& b) { return WIFSIGNALED(a.second) && !WIFSIGNALED(b.second); });
  for (auto& [w, status] : ended) on_ended(*w, status, now);
}

void Supervision::on_ended(Worker& w, int status, Clock::time_point now) {
  drain(w, now);  // what the worker wrote last (its failure line, "@done")
  w.running = false;
  --running_;
  ::close(w.heartbeat);
  const bool exited = WIFEXITED(status);
  const int code = exited ? WEXITSTATUS(status) : -1;
  if (exited && code == 0) return on_exited_zero(w);
  if (exited && code == kPreemptedExit) return on_preempted(w);
  if (w.accounted) return;  // already reported (hung, stopped responding, never started)
  if (w.killed) return on_killed(w);
  const bool by_interrupt = WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM);
  // A rank that was stopping on its own signal before the others failed on
  // its absence is the cause, however soon their failures are seen.
  if (w.terminated && !w.own_signal && ((exited && code == kInterruptedExit) || by_interrupt)) {
    spdlog::debug("rank {} stopped as asked", w.rank);
    return;
  }
  if ((exited && code == kInterruptedExit) || by_interrupt) return on_interrupted(w, status);
  on_failed(w, status, exited && code == 2 ? 2 : 1);
}

// Finished, or told to stop and did: neither is a failure. Anything else
// that exits 0 left the others waiting for it.
void Supervision::on_exited_zero(Worker& w) {
  if (w.done || w.terminated) return;
  fail(w, "exited early with code 0 during " + w.phase + ", without finishing the run, while other ranks " +
              "were still running (did a plugin call exit()?)", 1, true);
}

// Every rank agreed and a checkpoint was committed: not a failure.
void Supervision::on_preempted(const Worker& w) {
  if (preempted_rank_ >= 0 && w.rank >= preempted_rank_) return;
  preempted_rank_ = w.rank;
  preempted_ = w.has_report ? w.report : "preempted; rank " + std::to_string(w.rank) +
                                             " reported no checkpoint committed";
}

// A signal sent to the rank itself, not through the supervisor (`kill` on
// its process group, a terminal of its own): the interruption it is, exit
// 130 as if the supervisor had been interrupted, and the other ranks are
// interrupted alike (SIGINT) rather than left to fail on a missing peer.
void Supervision::on_interrupted(Worker& w, int status) {
  w.accounted = true;
  // kiln got a signal too (`pkill kiln`, a job step's signal): the launcher's
  // own interruption, reported as if the rank had not ended first.
  if (signal_ && signal_->load() != 0) {
    take_signal();
    return;
  }
  const std::string what = w.has_report && !w.report.empty()
                               ? w.report
                               : "interrupted: rank " + std::to_string(w.rank) + " " + describe_status(status);
  // A rank that got no signal itself stopped with a signalled peer (their
  // stop vote): the peer, perhaps not reaped yet, is the cause.
  for (auto& other : workers_)
    if (other.running) drain(other, Clock::now());
  const bool echo = !w.signalled && std::any_of(workers_.begin(), workers_.end(), [&](const Worker& other) {
    return &other != &w && other.signalled != 0;
  });
  if (echo) {
    failures_.push_back({w.rank, what, kInterruptedExit, false, w.phase, w.has_report});
    stop_all("rank " + std::to_string(w.rank) + " stopped with an interrupted rank", SIGINT);
    return;
  }
  const std::string cause = what + "; the signal was sent to the rank (pid " + std::to_string(w.pid) +
                            "), not to kiln's launcher";
  failures_.push_back({w.rank, cause, kInterruptedExit, true, w.phase, w.has_report});
  stop_all("rank " + std::to_string(w.rank) + " was interrupted", SIGINT);
}

// The supervisor's SIGKILL after SIGTERM went unanswered: the cause is where
// the worker was stuck, when it said so.
void Supervision::on_killed(Worker& w) {
  if (!w.busy_hook.empty()) {
    fail(w, "hung in " + w.busy_hook + " (no progress for " + std::to_string(w.busy_seconds) +
                " s; it did not stop after SIGTERM and was killed)", 1, true);
    return;
  }
  failures_.push_back({w.rank, who(w) + "did not stop within " +
                                   std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options_.grace).count()) +
                                   " s of SIGTERM and was killed", 1, false, w.phase, false});
}

void Supervision::on_failed(Worker& w, int status, int code) {
  std::string cause = describe_status(status);
  if (w.step >= 0) cause += " at step " + std::to_string(w.step);
  if (w.has_report)
    cause += ": " + w.report;
  else if (!w.busy_hook.empty())
    cause += " in " + w.busy_hook;
  else
    cause += " during " + w.phase + " (it reported no cause; see its output above)";
  const bool root = !w.has_report || w.report_root;
  if (stopping_ && !root) {
    spdlog::debug("rank {} {}", w.rank, cause);
    return;
  }
  fail(w, cause, code, root);
}

void Supervision::take_signal() {
  const int s = signal_ ? signal_->load() : 0;
  if (!s) return;
  const std::string why = std::string("interrupted by SIG") + sigabbrev_np(s);
  failures_.push_back({-1, why, 130, true, "", false});
  stop_all(why, s);
}

void Supervision::check_liveness(Clock::time_point now) {
  for (auto& w : workers_) {
    if (!w.running || w.accounted) continue;
    if (!w.alive_seen && now - w.spawned > options_.startup_timeout) {
      kill_now(w);
      fail(w, "did not start within " + std::to_string(seconds_between(w.spawned, now)) +
                  " s (no sign of life since it was launched)", 1, true);
    } else if (w.alive_seen && now - w.last_beat > options_.heartbeat_timeout) {
      // A stopped process ignores SIGTERM until continued: SIGKILL it.
      kill_now(w);
      fail(w, "stopped responding during " + w.phase + " (no heartbeat for " +
                  std::to_string(seconds_between(w.last_beat, now)) + " s: stopped or frozen)", 1, true);
    }
  }
}

// `forward` is the signal the workers get: SIGTERM on a failure, else the
// very signal the supervisor received (SIGINT interrupts; the preemption
// signal lets the workers checkpoint): each rank tells them apart as a
// single process does.
void Supervision::stop_all(const std::string& why, int forward) {
  if (stopping_) return;
  stopping_ = true;
  kill_at_ = Clock::now() + options_.grace;
  spdlog::warn("{}; stopping the workers (SIG{}, SIGKILL after {} s)", why, sigabbrev_np(forward),
               std::chrono::duration<double>(options_.grace).count());
  for (auto& w : workers_) {
    if (!w.running) continue;
    drain(w, Clock::now());  // what it said last: that it got a signal itself?
    w.terminated = true;
    // A rank stopping on a signal of its own gets none from here: a second
    // one would end it without cleanup. SIGKILL after the grace still comes.
    if (w.signalled) {
      w.own_signal = true;
      spdlog::debug("rank {} is stopping on SIG{} already", w.rank, sigabbrev_np(w.signalled));
      continue;
    }
    ::kill(w.pid, forward);
  }
}

void Supervision::fail(Worker& w, const std::string& cause, int code, bool root) {
  w.accounted = true;
  failures_.push_back({w.rank, who(w) + cause, code, root, w.phase, w.has_report});
  stop_all("rank " + std::to_string(w.rank) + " " + cause);
}

// The supervisor's own kill: the cause is what made it necessary.
void Supervision::kill_now(Worker& w) {
  w.killed = true;
  ::kill(w.pid, SIGKILL);
}

SupervisorResult Supervision::outcome() const {
  SupervisorResult result;
  // Preempted workers and no failure but the signal that caused it: the run
  // was preempted, not failed.
  const bool only_signal = std::all_of(failures_.begin(), failures_.end(), [](const Observed& f) { return f.rank < 0; });
  if (preempted_rank_ >= 0 && only_signal) {
    result.exit_code = kPreemptedExit;
    result.report = preempted_;
    return result;
  }
  // The first root cause, else the first failure of any kind.
  const Observed* chosen = nullptr;
  for (const auto& f : failures_)
    if (f.root) {
      chosen = &f;
      break;
    }
  if (!chosen && !failures_.empty()) chosen = &failures_.front();
  if (chosen) {
    result.exit_code = chosen->code;
    result.report = chosen->cause;
    result.rank = chosen->rank;
    result.phase = chosen->phase;
    result.reported = chosen->reported;
  }
  return result;
}

}  // namespace

SupervisorResult supervise(const SupervisorOptions& options, const std::atomic<int>* signal) {
  const int port = options.master_port > 0 ? options.master_port : free_port();
  const std::string run_id = std::to_string(::getpid()) + "-" + std::to_string(port);
  spdlog::info("starting {} worker processes (rendezvous {}:{})", options.processes, options.master_addr, port);
  Supervision supervision(options, signal);
  supervision.start(port, run_id);
  while (supervision.any_running()) supervision.step();
  return supervision.outcome();
}

}  // namespace kiln
