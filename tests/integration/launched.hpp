// A kiln process a test acts on while it runs (signals, SIGKILL), started in
// a process group of its own as a shell starts a foreground job, and waits
// bounded against hangs. Used by signals_test.cpp and run_dir_test.cpp.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <optional>
#include <thread>

#include "common.hpp"

namespace kiln::test {

// A bound against hangs (a loaded machine may take long to start two
// ranks), never a measure of speed.
inline std::chrono::duration<double> hang_bound() { return std::chrono::duration<double>(120 * timeout_scale()); }

// Polls `condition` every `every` until it holds, or the bound passes.
inline bool wait_until(const std::function<bool()>& condition,
                       std::chrono::milliseconds every = std::chrono::milliseconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + hang_bound();
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(every);
  }
  return condition();
}

// How many whole lines of `text` are `line`.
inline int count_lines(const std::string& text, const std::string& line) {
  int n = 0;
  for (size_t at = 0; (at = text.find(line + "\n", at)) != std::string::npos; at += line.size())
    if (at == 0 || text[at - 1] == '\n') ++n;
  return n;
}

// `kiln ARGS...`, its stdout and stderr in `out`. However the test ends,
// nothing of the run (the processes mentioning `dir`) outlives it.
class Launched {
 public:
  Launched(const TempDir& dir, const std::vector<std::string>& args, std::filesystem::path out)
      : marker_(dir.path().string()), out_(std::move(out)) {
    std::vector<std::string> argv{kiln_exe().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(raw[0], raw.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~Launched() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (pid_t p : processes_mentioning(marker_)) ::kill(p, SIGKILL);
  }
  Launched(const Launched&) = delete;
  Launched& operator=(const Launched&) = delete;

  pid_t pid() const { return pid_; }
  std::string output() const { return read_file(out_); }
  // Its wait status, or nullopt when it did not end within the bound.
  std::optional<int> wait() {
    if (reaped_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + hang_bound();
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, &status_, WNOHANG) == pid_) {
        reaped_ = true;
        return status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
  // Whether it ended with exit code `code`; false while it runs.
  bool exited_with(int code) {
    if (!reaped_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_ && WIFEXITED(status_) && WEXITSTATUS(status_) == code;
  }
  bool ended() {
    if (!reaped_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }

 private:
  std::string marker_;
  std::filesystem::path out_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

}  // namespace kiln::test
