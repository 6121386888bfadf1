#include "distributed/shm_segment.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln {

namespace {

constexpr const char* kDirectory = "/dev/shm";

std::string error_text(const std::string& what, const std::string& name) {
  return std::string(what) + " " + name + ": " + std::strerror(errno);
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) throw std::runtime_error(error_text("cannot map shared memory", name));
  return data;
}

}  // namespace

ShmSegment::ShmSegment(std::string name, void* data, size_t size, int handle)
    : name_(std::move(name)), data_(data), size_(size), handle_(handle) {}

ShmSegment ShmSegment::create(size_t bytes) {
  // An unnamed file of /dev/shm's tmpfs: the same memory, and the same size
  // limit, as a POSIX segment (shm_open), without the name that a SIGKILL
  // between creating it and unlinking it would leave behind.
  const int fd = ::open(kDirectory, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(error_text("cannot create shared memory in", kDirectory));
  const std::string name = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd);
  // Reserved now, not on first touch: a /dev/shm too small (a container's
  // 64 MiB) is an error here, where the run can fall back to Gloo, rather
  // than a SIGBUS in the middle of an all-reduce.
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    errno = error;
    const std::string text =
        error_text("cannot reserve " + std::to_string(bytes >> 20) + " MiB of shared memory in", kDirectory);
    ::close(fd);
    throw std::runtime_error(text);
  }
  try {
    void* data = map(fd, bytes, name);
    return ShmSegment(name, data, bytes, fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  if (name.rfind("/proc/", 0) != 0) throw std::runtime_error("shared memory handle '" + name + "' is not one kiln made");
  const int fd = ::open(name.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(error_text("cannot open shared memory", name));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw std::runtime_error("shared memory " + name + " is smaller than the " + std::to_string(bytes) +
                             " bytes expected");
  }
  void* data = nullptr;
  try {
    data = map(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return ShmSegment(name, data, bytes, -1);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      handle_(std::exchange(other.handle_, -1)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    this->~ShmSegment();
    new (this) ShmSegment(std::move(other));
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_) ::munmap(data_, size_);
}

void ShmSegment::unlink() {
  if (handle_ < 0) return;
  ::close(handle_);
  handle_ = -1;
}

}  // namespace kiln
