#include "util/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <system_error>

namespace kiln {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Fd::reset() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

int Fd::close_checked() noexcept {
  if (fd_ < 0) return 0;
  const int rc = ::close(std::exchange(fd_, -1));
  if (rc != 0 && errno != EINTR) return errno;
  return 0;
}

std::string error_text(int err) { return std::generic_category().message(err); }

int write_all(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    // write() returning 0 for a non-empty request makes no progress; treat
    // it as the device being full rather than spin.
    if (n == 0) return ENOSPC;
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

int fsync_retrying(int fd) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

std::filesystem::path temporary_for(const std::filesystem::path& final) {
  std::filesystem::path dir = final.parent_path();
  if (dir.empty()) dir = ".";
  return dir / ("." + final.filename().string() + ".tmp-" + std::to_string(::getpid()));
}

int fsync_directory(const std::filesystem::path& dir_in) {
  const std::filesystem::path dir = dir_in.empty() ? std::filesystem::path(".") : dir_in;
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno;
  const int err = fsync_retrying(fd.get());
  return err == EINVAL ? 0 : err;
}

namespace {

[[noreturn]] void fail(const std::filesystem::path& final, const std::string& step, int err) {
  throw std::runtime_error("cannot write " + final.string() + ": " + step + ": " + error_text(err));
}

// Unlinks the temporary unless disarmed: every error path leaves only the
// old file.
struct TemporaryGuard {
  const std::filesystem::path& path;
  bool armed = true;
  ~TemporaryGuard() {
    if (armed) ::unlink(path.c_str());
  }
};

}  // namespace

void write_file_durably(const std::filesystem::path& final, std::string_view bytes) {
  const std::filesystem::path temporary = temporary_for(final);
  // A leftover of a dead process that had our pid; O_EXCL below then means
  // "nobody else is writing this name in this process".
  ::unlink(temporary.c_str());
  Fd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) fail(final, "create " + temporary.string(), errno);
  TemporaryGuard guard{temporary};
  if (const int err = write_all(fd.get(), bytes.data(), bytes.size())) fail(final, "write " + temporary.string(), err);
  if (const int err = fsync_retrying(fd.get())) fail(final, "fsync " + temporary.string(), err);
  if (const int err = fd.close_checked()) fail(final, "close " + temporary.string(), err);
  if (::rename(temporary.c_str(), final.c_str()) != 0) fail(final, "rename " + temporary.string(), errno);
  guard.armed = false;
  if (const int err = fsync_directory(final.parent_path())) fail(final, "fsync its directory", err);
}

void link_durably(const std::filesystem::path& existing, const std::filesystem::path& final) {
  const std::filesystem::path temporary = temporary_for(final);
  ::unlink(temporary.c_str());
  if (::link(existing.c_str(), temporary.c_str()) != 0) fail(final, "link " + existing.string(), errno);
  TemporaryGuard guard{temporary};
  if (::rename(temporary.c_str(), final.c_str()) != 0) fail(final, "rename " + temporary.string(), errno);
  guard.armed = false;
  if (const int err = fsync_directory(final.parent_path())) fail(final, "fsync its directory", err);
}

}  // namespace kiln
