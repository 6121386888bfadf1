// A POSIX shared-memory segment mapped into this process (RAII). One rank
// creates it under a fresh name, the others open it by that name; once every
// rank has it mapped the name is unlinked, so nothing is left in /dev/shm
// however the processes end. No LibTorch here.
#pragma once

#include <cstddef>
#include <string>

namespace kiln {

class ShmSegment {
 public:
  // A new segment of `bytes` (zero-filled) under a name no other segment has:
  // "/kiln-<pid>-<random>". Throws std::runtime_error naming the cause.
  static ShmSegment create(size_t bytes);
  // The segment another process created. Throws std::runtime_error when the
  // name does not exist here (another host, another /dev/shm) or is smaller
  // than `bytes`.
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps; unlinks the name if this process created it and has not yet

  const std::string& name() const { return name_; }
  void* data() const { return data_; }
  size_t size() const { return size_; }
  // Removes the name (the mapping stays valid). Idempotent.
  void unlink();

 private:
  ShmSegment(std::string name, void* data, size_t size, bool owner);

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_by_me_ = false;
};

}  // namespace kiln
