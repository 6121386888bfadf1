// Fit's optimizer as the run wires it: over what this rank steps (every
// trainable value, or with distributed.shard the elements it owns),
// registered with the checkpoints, and the optimizer-step seam the fit loop
// calls (optim/replicated_step.hpp, optim/sharded_step.hpp) with the
// gradients' transport that goes with it.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/manifest.hpp"
#include "loop_parts/loop_parts.hpp"
#include "optim/param_groups.hpp"
#include "optim/shard_layout.hpp"
#include "optim/sharded_parameters.hpp"
#include "train/run/run_checkpoints.hpp"

namespace kiln {

class GradScaler;
class GradSync;
class NonfiniteWatch;
class Profiler;
class ProcessGroup;
class WeightAveraging;

class RunOptimizer {
 public:
  // Makes `state.optimizer` for `groups` and registers it with
  // `checkpoints`. Throws InputError for a shard mode with gradient
  // compression. `group`: null in one process.
  RunOptimizer(const Manifest& manifest, TrainingState& state, const std::vector<ParamGroup>& groups,
               RunCheckpoints& checkpoints, ProcessGroup* group, int32_t rank, int32_t world_size);
  ~RunOptimizer();
  RunOptimizer(const RunOptimizer&) = delete;
  RunOptimizer& operator=(const RunOptimizer&) = delete;

  // The step for the loop, once the ranks agree on the weights (a
  // replicated run's gradient buckets are made over the agreed tensors).
  // The pointers may be null (off).
  std::unique_ptr<OptimizerStep> step(GradScaler* scaler, NonfiniteWatch* nonfinite, WeightAveraging* averaging,
                                      Profiler* profiler);

  // distributed.shard = "parameters": the sharded parameters (null
  // otherwise), to shard() once the ranks agree on the weights and to read
  // through while the loop runs.
  ShardedParameters* sharded_parameters() { return parameters_ ? &*parameters_ : nullptr; }
  // Once the ranks agree on the weights (and sharded parameters are
  // sharded): bf16-true's float32 masters are taken from the agreed
  // weights, rank 0's, unless `resumed` (the checkpoint's masters were
  // loaded). Made before the agreement, a rank's masters were its own
  // plugin's weights, and its first step would have written them back.
  void weights_agreed(bool resumed);
  // What trainer.detect_nonfinite checks before a commit: the weights this
  // rank steps (its own elements when sharded, the whole ones otherwise).
  const std::vector<at::Tensor>& stepped_weights() const;

 private:
  const Manifest& m_;
  TrainingState& state_;
  ProcessGroup* group_;
  std::unique_ptr<GradSync> grad_sync_;
  std::optional<ShardLayout> shard_layout_;  // distributed.shard != none
  std::vector<at::Tensor> owned_;            // its views of this rank's elements (bf16-true's masters: float32 copies)
  std::vector<at::Tensor> masters_;          // bf16-true, replicated: float32 copies of the trainable weights
  std::optional<ShardedParameters> parameters_;  // distributed.shard = "parameters"
};

}  // namespace kiln
