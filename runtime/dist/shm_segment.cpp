#include "dist/shm_segment.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln {

namespace {

std::string error_text(const std::string& what, const std::string& name) {
  return std::string(what) + " " + name + ": " + std::strerror(errno);
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) throw std::runtime_error(error_text("cannot map shared memory", name));
  return data;
}

}  // namespace

ShmSegment::ShmSegment(std::string name, void* data, size_t size, bool owner)
    : name_(std::move(name)), data_(data), size_(size), linked_by_me_(owner) {}

ShmSegment ShmSegment::create(size_t bytes) {
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof name, "/kiln-%d-%08x%08x", static_cast<int>(::getpid()), random(), random());
    const int fd = ::shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 8) continue;
      throw std::runtime_error(error_text("cannot create shared memory", name));
    }
    // Reserved now, not on first touch: a /dev/shm too small (a container's
    // 64 MiB) is an error here, where the run can fall back to Gloo, rather
    // than a SIGBUS in the middle of an all-reduce.
    if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
      errno = error;
      const std::string text = error_text("cannot reserve " + std::to_string(bytes >> 20) + " MiB of shared memory for", name);
      ::close(fd);
      ::shm_unlink(name);
      throw std::runtime_error(text);
    }
    try {
      void* data = map(fd, bytes, name);
      ::close(fd);
      return ShmSegment(name, data, bytes, /*owner=*/true);
    } catch (...) {
      ::close(fd);
      ::shm_unlink(name);
      throw;
    }
  }
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(error_text("cannot open shared memory", name));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
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
  return ShmSegment(name, data, bytes, /*owner=*/false);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      linked_by_me_(std::exchange(other.linked_by_me_, false)) {}

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
  if (!linked_by_me_) return;
  ::shm_unlink(name_.c_str());
  linked_by_me_ = false;
}

}  // namespace kiln
