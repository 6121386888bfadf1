// A shared-memory segment mapped into this process (RAII). One rank creates
// it, the others open it through the creator's handle; once every rank has
// it mapped the handle is withdrawn. The segment is an unnamed file in
// /dev/shm (O_TMPFILE): it never has a name, so nothing can be left in
// /dev/shm however any process ends, SIGKILL at any instant included. Its
// handle is "/proc/<creator's pid>/fd/<descriptor>", which opens the same
// memory while the creator lives and holds the descriptor. No LibTorch here.
#pragma once

#include <cstddef>
#include <string>

namespace kiln {

class ShmSegment {
 public:
  // A new segment of `bytes` (zero-filled, its pages reserved in /dev/shm),
  // with a handle for other processes: name(). Throws std::runtime_error
  // naming the cause.
  static ShmSegment create(size_t bytes);
  // The segment another process created, by its handle. Throws
  // std::runtime_error when the handle cannot be opened here (another host,
  // another pid namespace, a withdrawn handle) or the segment is smaller than
  // `bytes`.
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps; withdraws the handle if this process created it and has not yet

  const std::string& name() const { return name_; }
  void* data() const { return data_; }
  size_t size() const { return size_; }
  // Withdraws the handle: no other process can open the segment from now
  // on (the mappings stay valid). Idempotent.
  void unlink();

 private:
  ShmSegment(std::string name, void* data, size_t size, int handle);

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  int handle_ = -1;  // the creator's descriptor, until withdrawn
};

}  // namespace kiln
