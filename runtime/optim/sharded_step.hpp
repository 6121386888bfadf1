// distributed.shard = "optimizer": ZeRO stage 1. Each rank's optimizer
// holds state (Adam's moments, SGD's momentum, ...) for the elements it owns
// only (optim/shard_layout.hpp): its parameters are 1-D views into the
// model's parameters, one per trainable parameter (empty where it owns
// none). Backward is the replicated step's (the gradients all-reduced in
// buckets inside it, so every rank holds the same averaged gradients); the
// step unscales and clips the whole gradients as the replicated step does,
// steps the owned elements in place, then all-gathers them so that every
// rank holds the whole updated parameters. Every optimizer kiln builds is
// elementwise, so with the same reduction the weights and the optimizer's
// state are the replicated run's to the bit. Not yet: a reduce-scatter
// instead of the all-reduce (what each rank sends per step is still the
// whole gradient), and ZeRO-2's freeing of the gradients.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/replicated_step.hpp"
#include "optim/shard_layout.hpp"

namespace kiln {

class ProcessGroup;

// The values a rank all-gathers at once (the weights after a step, each
// field of the optimizer's state for a checkpoint): Gloo stages every
// rank's chunk in a buffer of its own, so this bounds what a gather needs
// besides what it fills.
constexpr int64_t kShardGatherChunk = int64_t{1} << 20;

// Copies between the flat index range [begin, begin + flat.numel()) of
// `layout` and the tensors, one per parameter, that hold it (`into_params`:
// from `flat` into them; else out of them). Past the last parameter lies
// the padding, which no tensor holds; an undefined tensor is skipped.
void copy_flat(const std::vector<at::Tensor>& params, const ShardLayout& layout, int64_t begin, at::Tensor flat,
               bool into_params);

class ShardedStep final : public OptimizerStep {
 public:
  // `whole.optimizer` is the optimizer over `owned` (owned_views of
  // `whole.trainable`); `group` is null in one process (one rank owns all).
  ShardedStep(ReplicatedStep::Parts whole, std::vector<at::Tensor> owned, ShardLayout layout, ProcessGroup* group);

  // Views of the elements this rank owns, one per trainable parameter, in
  // order. Throws InputError (one line) for parameters it cannot shard:
  // other than float32 and contiguous, or on more than one device.
  static std::vector<at::Tensor> owned_views(const std::vector<at::Tensor>& trainable, const ShardLayout& layout);

  void before_forward() override { whole_.before_forward(); }
  void backward(const at::Tensor& loss, bool sync) override { whole_.backward(loss, sync); }
  void step(int64_t global_step) override;
  void clear_gradients() override;

 private:
  // Every rank's owned elements into every rank's parameters.
  void gather_parameters();

  ReplicatedStep::Parts p_;
  ReplicatedStep whole_;
  std::vector<at::Tensor> owned_;
  ShardLayout layout_;
  ProcessGroup* group_;
};

}  // namespace kiln
