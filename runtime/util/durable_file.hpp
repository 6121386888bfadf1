// Writing files that must survive a crash or a power cut: checkpoints, the
// `last` link, metrics.csv, predictions.pt. A reader sees the old file or the
// new one, complete and fsync'ed, never a torn one. No LibTorch here.
//
// The protocol, everywhere: write a temporary in the same directory (a rename
// across file systems is not atomic), write everything (short writes and
// EINTR retried), fsync the file, close it checking the result, rename over
// the final name, fsync the directory so the rename itself is durable.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace kiln {

// Owns a file descriptor. The destructor closes it ignoring errors (used on
// error and cleanup paths); code that must know whether the close succeeded
// calls close_checked().
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() noexcept;
  // 0 or the errno of close(). On Linux the descriptor is released even when
  // close() fails, so it is never retried; EINTR is not a failure.
  int close_checked() noexcept;

 private:
  int fd_ = -1;
};

// strerror for an errno value, thread-safe.
std::string error_text(int err);

// write() until everything is written, retrying EINTR and short writes.
// Returns 0 or the errno of the failure (ENOSPC for a write that makes no
// progress).
int write_all(int fd, const void* data, size_t size);

// fsync() retrying EINTR. Returns 0 or the errno.
int fsync_retrying(int fd);

// The temporary a writer of `final` uses: ".<name>.tmp-<pid>" next to it, so
// that a sweep can tell a dead writer's leftovers from a live one's.
std::filesystem::path temporary_for(const std::filesystem::path& final);

// Makes a rename in `dir` durable. Returns 0 or the errno; EINVAL (a file
// system that cannot sync directories) counts as done.
int fsync_directory(const std::filesystem::path& dir);

// Replaces `final` with `bytes` by the protocol above. On failure nothing is
// left behind but the old file, and std::runtime_error says, on one line,
// "cannot write <final>: <step>: <errno text>".
void write_file_durably(const std::filesystem::path& final, std::string_view bytes);

// Publishes `existing` under a second name `final` (a hard link made under a
// temporary name, renamed over `final`, directory fsync'ed): atomic, and no
// second copy of the bytes. Same error form as write_file_durably.
void link_durably(const std::filesystem::path& existing, const std::filesystem::path& final);

}  // namespace kiln
