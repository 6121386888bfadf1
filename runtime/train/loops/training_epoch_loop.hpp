// One training epoch: batches in the sampler's order, the training step,
// backward and the optimizer step through the OptimizerStep seam
// (loop_parts.hpp: how gradients are reduced, clipped and stepped is its
// business), gradient accumulation, the LR schedule, step checkpoints and
// stop votes. Its position (epoch, next batch, global step) is what a
// checkpoint saves and what a resumed epoch continues from.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "train/loops/checkpoint_policy.hpp"
#include "loop_parts/loop_parts.hpp"
#include "train/loops/stop_condition.hpp"

namespace torch::optim {
class Optimizer;
}

namespace kiln {

class LrSchedule;
class NonfiniteWatch;
class WeightAveraging;

struct TrainingSettings {
  EpochSpec spec;
  int64_t accumulate_grad_batches = 1;
  int64_t checkpoint_every_n_steps = 0;  // 0: no step checkpoints
};

// What the loop steps.
struct Optimization {
  OptimizerStep& step;                   // backward and the optimizer step (the seam)
  torch::optim::Optimizer& optimizer;    // whose learning rates the schedule sets
  const LrSchedule& schedule;
  NonfiniteWatch* nonfinite = nullptr;   // trainer.detect_nonfinite; null: off
  WeightAveraging* averaging = nullptr;  // [averaging]'s epoch ends and evaluations; null: off
};

class TrainingEpochLoop {
 public:
  TrainingEpochLoop(LoopContext& context, const TrainingSettings& settings, Optimization optimization,
                    StopCondition& stop, CheckpointPolicy& policy);

  struct Result {
    int64_t next_batch = 0;  // the batch a resumed run would run next
    int64_t next_sample = 0; // where in the epoch's global order it would continue
    int64_t batches = 0;     // batches in the epoch
    int64_t samples = 0;     // samples trained on, all ranks together
    bool stopped = false;    // the stop condition ended the epoch early
  };
  // After which batches of an epoch `validate(epoch, batch)` runs: every
  // `every` batches (as Lightning's val_check_interval counts them), never
  // after the last (the epoch's end has its own). Unset: none.
  struct MidEpochValidation {
    BatchLimit every;
    std::function<void(int64_t epoch, int64_t batch)> validate;
  };
  // Runs epoch `epoch` after its first `first_sample` samples (0: all of it).
  Result run(int64_t epoch, int64_t first_sample, const MidEpochValidation* validation = nullptr);

 private:
  // One batch: forward, backward and, at an accumulation boundary, the
  // optimizer step. Returns the loss, detached.
  at::Tensor train_batch(BatchPtr batch, int64_t index, bool boundary, const BatchStream& stream);
  void optimizer_step();

  LoopContext& context_;
  TrainingSettings settings_;
  Optimization optimization_;
  StopCondition& stop_;
  CheckpointPolicy& policy_;
};

}  // namespace kiln
