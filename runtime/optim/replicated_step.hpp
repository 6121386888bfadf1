// Data parallelism's optimizer step as DDP takes it: every rank holds the
// whole optimizer state; gradients are all-reduced in buckets inside
// backward (distributed/grad_sync.hpp, overlapped with it), then unscaled
// (16-mixed's GradScaler), clipped (optim/gradient_clipping.hpp: every rank
// holds every reduced gradient, so the norm needs no reduction), stepped,
// and the averaged weights follow. The implementation of the loop's
// OptimizerStep seam (loop_parts/loop_parts.hpp) for `distributed.shard =
// none`, in one process too (no GradSync).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/gradient_clipping.hpp"
#include "loop_parts/loop_parts.hpp"

namespace torch::optim {
class Optimizer;
}

namespace kiln {

class GradScaler;
class GradSync;
class NonfiniteWatch;
class Profiler;
class WeightAveraging;

class ReplicatedStep final : public OptimizerStep {
 public:
  struct Parts {
    torch::optim::Optimizer& optimizer;
    const std::vector<at::Tensor>& trainable;  // the optimizer's parameters, in order
    GradientClipping clipping;
    GradSync* grad_sync = nullptr;         // null in one process
    GradScaler* scaler = nullptr;          // 16-mixed only
    NonfiniteWatch* nonfinite = nullptr;   // told the gradients' norm; null: off
    WeightAveraging* averaging = nullptr;  // [averaging]; null: off
    Profiler* profiler = nullptr;          // [profiler]: the all-reduce's waits
    // bf16-true (optim/master_weights.hpp): the model's bfloat16 parameters,
    // whose float32 masters `trainable` is; null: `trainable` is the model's.
    const std::vector<at::Tensor>* model = nullptr;
  };
  explicit ReplicatedStep(Parts parts) : p_(parts) {}

  void before_forward() override;
  void backward(const at::Tensor& loss, bool sync) override;
  void step(int64_t global_step) override;
  void clear_gradients() override;

 private:
  Parts p_;
};

}  // namespace kiln
