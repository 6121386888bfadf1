#include "device/batch_mover.hpp"

#include <stdexcept>

#include <ATen/ATen.h>

#ifdef KILN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "plugin/host_objects.hpp"

namespace kiln {

#ifdef KILN_WITH_CUDA
struct BatchMover::Streams {
  explicit Streams(c10::Device device) : copy(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}
  c10::cuda::CUDAStream copy;
  at::cuda::CUDAEvent copied;
};
#else
struct BatchMover::Streams {};
#endif

BatchMover::BatchMover(c10::Device device) : device_(device) {
#ifdef KILN_WITH_CUDA
  if (device_.is_cuda()) streams_ = std::make_unique<Streams>(device_);
#endif
  if (!device_.is_cpu() && !streams_)
    throw std::logic_error("BatchMover: device " + device_.str() + " in a kiln built without CUDA");
}

BatchMover::~BatchMover() = default;

void BatchMover::pin(kiln_batch& batch) const {
  if (!moves()) return;
  for (auto& [name, tensor] : batch.tensors)
    if (tensor.device().is_cpu() && !tensor.is_pinned()) tensor = tensor.pin_memory();
}

void BatchMover::start(kiln_batch& batch) {
  if (!moves()) return;
#ifdef KILN_WITH_CUDA
  // The copy stream first waits for the compute stream's work so far: memory
  // the caching allocator hands the copies may have been freed by it.
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  at::cuda::CUDAEvent compute_so_far;
  compute_so_far.record(compute);
  compute_so_far.block(streams_->copy);
  {
    c10::cuda::CUDAStreamGuard on_copy_stream(streams_->copy);
    for (auto& [name, tensor] : batch.tensors) tensor = tensor.to(device_, /*non_blocking=*/true);
  }
  streams_->copied.record(streams_->copy);
#else
  (void)batch;
#endif
}

void BatchMover::finish(kiln_batch& batch) {
  if (!moves()) return;
#ifdef KILN_WITH_CUDA
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  streams_->copied.block(compute);
  // Allocated on the copy stream, used and freed on the compute stream: the
  // allocator must not reuse the memory before the compute stream is done.
  for (auto& [name, tensor] : batch.tensors)
    if (tensor.is_cuda()) tensor.record_stream(compute);
#else
  (void)batch;
#endif
}

void make_current(c10::Device device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

}  // namespace kiln
