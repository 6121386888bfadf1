// Batches from host memory to the run's device. Data modules hand over CPU
// tensors (abi.h); on a CUDA device the prefetch thread page-locks them
// (pin), the main thread issues their copies on a stream of their own
// (start) and makes the compute stream wait for them only when the batch is
// taken (finish): the copy of batch k+1 runs while the GPU computes batch k,
// and the host never waits for either. On the CPU every call does nothing.
#pragma once

#include <memory>

#include <c10/core/Device.h>

struct kiln_batch;

namespace kiln {

class BatchMover {
 public:
  explicit BatchMover(c10::Device device);
  ~BatchMover();
  BatchMover(const BatchMover&) = delete;
  BatchMover& operator=(const BatchMover&) = delete;

  // Whether batches move at all (false on the CPU).
  bool moves() const { return !device_.is_cpu(); }
  // [prefetch thread] Page-locked copies of the batch's CPU tensors, so that
  // the copies to the device can be asynchronous.
  void pin(kiln_batch& batch) const;
  // [main thread] Issues the copies to the device; at most one batch is
  // started and not finished at a time.
  void start(kiln_batch& batch);
  // [main thread] The compute stream waits for the started copies.
  void finish(kiln_batch& batch);

 private:
  c10::Device device_;
  struct Streams;  // CUDA only
  std::unique_ptr<Streams> streams_;
};

// Makes a CUDA `device` the current one of the process's main thread, so
// that what a plugin allocates "on CUDA" lands on its rank's GPU. Nothing on
// the CPU.
void make_current(c10::Device device);

}  // namespace kiln
