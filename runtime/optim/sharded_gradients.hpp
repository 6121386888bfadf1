// The gradients of a sharded optimizer step (distributed.shard = optimizer
// or gradients): reduce-scattered in buckets while backward still runs, as
// DDP's Reducer all-reduces them, so that each rank ends with the averaged
// gradients of the elements it owns (optim/shard_layout.hpp) and nothing
// else. A hook on every parameter's gradient accumulator marks it ready;
// buckets (whole parameters, contiguous in the flat space, from the last
// parameter back: the order backward produces them; DDP's sizes) are
// reduced in the same order on every rank, each as soon as it and every
// bucket before it are ready, the rest once backward returns.
//
// Each rank's contribution is its gradient times 1/W, summed in rank order:
// what the Reducer and the shared-memory all-reduce compute, so the owned
// sums are the replicated run's to the bit. With `free_reduced` (ZeRO-2) a
// parameter's whole gradient is dropped as soon as its bucket is reduced,
// and every backward is reduced (accumulation adds into the owned sums);
// else (ZeRO-1) the whole gradients stay until the step, and a backward
// that does not synchronise (accumulation's early micro-batches) only
// accumulates locally, as DDP's no_sync().
//
// Thread: the hooks run on the autograd thread, one at a time; everything
// else on the loop's thread, never during a backward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/shard_layout.hpp"

namespace kiln {

class ProcessGroup;

class ShardedGradients {
 public:
  // `trainable` are the optimizer's parameters in order (leaves requiring
  // gradients, of one floating dtype, contiguous); `group` is null in one
  // process. `owned_dtype`: the owned sums' (float32 for bf16-true's
  // float32 masters; the parameters' own when the optimizer steps them).
  // Whatever it is, the ranks' contributions are summed in float32 and
  // rounded once, as the replicated buckets are.
  ShardedGradients(const std::vector<at::Tensor>& trainable, const ShardLayout& layout, ProcessGroup* group,
                   bool free_reduced, at::ScalarType owned_dtype);
  ~ShardedGradients();  // removes the hooks
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;

  // Around one backward: whether it synchronises (false: accumulation's
  // early micro-batches), then the buckets backward did not reduce.
  void before_backward(bool sync);
  void after_backward();

  // The owned gradient of parameter i (a view of this rank's shard), or
  // undefined when nothing was reduced since the last clear().
  at::Tensor owned_gradient(size_t i) const;
  // The next step's gradients start from nothing (the whole ones dropped too).
  void clear();

 private:
  struct Bucket {
    size_t first, last;  // parameters [first, last)
    int64_t pending = 0;
  };
  void ready(size_t parameter);
  void reduce(Bucket& bucket);

  std::vector<at::Tensor> params_;
  const ShardLayout& layout_;
  ProcessGroup* group_;
  bool free_reduced_;
  double inverse_world_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // by parameter
  // Each removes one hook, keeping its gradient accumulator alive until then
  // (LibTorch 1.13 holds accumulators in a shared_ptr, 2.x in an intrusive_ptr).
  std::vector<std::function<void()>> unhook_;
  at::Tensor owned_;  // this rank's shard of the averaged gradients
  bool armed_ = false;       // inside a backward that reduces
  bool accumulate_ = false;  // add to owned_ (a later micro-batch of the step)
  bool reduced_ = false;     // owned_ holds this step's sums
  size_t next_ = 0;          // the next bucket to reduce
};

}  // namespace kiln
