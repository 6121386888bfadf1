// optimizer.fused = true: Adam and AdamW stepped in one pass over each
// parameter's elements (read the weight, gradient and both moments once,
// write the weight and moments once), as PyTorch's `fused=True` on the CPU
// (2.4+), where LibTorch's step runs about ten elementwise passes. The
// state is LibTorch's own (AdamParamState / AdamWParamState), so
// checkpoints, the registry's save/load and resuming with fused = false
// are unchanged. The arithmetic is LibTorch's, float32, in another order:
// within a few float32 ulps of it per step (unit.FusedAdam.*). A parameter
// that is not a contiguous float32 CPU tensor takes LibTorch's path.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

namespace kiln {

class FusedAdam final : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  at::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdamW final : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace kiln
