// distributed.shard = "optimizer" (ZeRO stage 1) and "gradients" (stage
// 2): each rank's optimizer holds state (Adam's moments, SGD's momentum,
// ...) for the elements it owns only (optim/shard_layout.hpp): its
// parameters are 1-D views into the model's parameters, one per trainable
// parameter (empty where it owns none). Backward reduce-scatters the
// gradients in buckets as it runs (optim/sharded_gradients.hpp), so each
// rank holds the averaged gradients of its own elements; the step unscales
// them (the scaler's verdict agreed by every rank), clips them (by the
// global norm: each rank's squared norm summed over ranks), steps the
// owned elements in place, then all-gathers them so that every rank holds
// the whole updated parameters. Every optimizer kiln builds is elementwise,
// so with the same reduction order the weights and the optimizer's state
// are the replicated run's to the bit, but for the norm's rounding when
// clipping by norm and, with "gradients", for accumulation (each
// micro-batch's sums are added, where the replicated run sums the
// accumulated gradients once).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/replicated_step.hpp"
#include "optim/shard_layout.hpp"
#include "optim/sharded_gradients.hpp"

namespace kiln {

class ProcessGroup;
class ShardedParameters;

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
  // `whole.trainable`; `whole.grad_sync` unused); `group` is null in one
  // process (one rank owns all). `free_gradients`: ZeRO-2. `masters`
  // (bf16-true): `owned` are float32 copies of the elements
  // (optim/master_weights.hpp), rounded into every rank's bfloat16
  // parameters by the gather, this rank's own included.
  // `parameters` (ZeRO-3): `owned` are its shard's (or the masters of
  // it): nothing is gathered after a step, every whole parameter is freed
  // after each backward.
  ShardedStep(ReplicatedStep::Parts whole, std::vector<at::Tensor> owned, const ShardLayout& layout,
              ProcessGroup* group, bool free_gradients, bool masters = false,
              ShardedParameters* parameters = nullptr);

  // Views of the elements this rank owns, one per trainable parameter, in
  // order. Throws InputError (one line) for parameters it cannot shard:
  // other than float32 (`any_dtype`: bf16-true's masters copy them) and
  // contiguous, or on more than one device.
  static std::vector<at::Tensor> owned_views(const std::vector<at::Tensor>& trainable, const ShardLayout& layout,
                                             bool any_dtype = false);

  void before_forward() override {}
  void backward(const at::Tensor& loss, bool sync) override;
  void step(int64_t global_step) override;
  void clear_gradients() override;

 private:
  // Every rank's owned elements into every rank's parameters.
  void gather_parameters();

  // Sums over ranks (the clipping norm's squares, the scaler's verdicts).
  at::Tensor sum_over_ranks(at::Tensor value, const char* what) const;

  ReplicatedStep::Parts p_;
  std::vector<at::Tensor> owned_;
  const ShardLayout& layout_;
  ProcessGroup* group_;
  bool masters_;
  ShardedParameters* parameters_;
  ShardedGradients gradients_;
};

}  // namespace kiln
