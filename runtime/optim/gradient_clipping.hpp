// trainer.gradient_clip_val / gradient_clip_algorithm: by value, or by the
// global 2-norm of every gradient. The norm is computed from squared norms
// a part at a time so that an optimizer step whose ranks each hold a part
// of the gradients (a shard) can sum them across ranks before taking the
// root; the replicated step holds them all.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

class NonfiniteWatch;

struct GradientClipping {
  double value = 0.0;    // 0: off
  bool by_value = false;  // else by norm
};

// Clips the gradients of `params` in place. By norm: `reduce` (may be
// empty) turns this rank's squared norm into the global one (a sum over
// ranks); `nonfinite` (may be null) is told the norm. The arithmetic stays
// on the device: LibTorch's clip_grad_norm_ returns the norm as a double, a
// read-back of the device every step.
void clip_gradients(const std::vector<at::Tensor>& params, const GradientClipping& clipping,
                    const std::function<at::Tensor(at::Tensor)>& reduce, NonfiniteWatch* nonfinite);

}  // namespace kiln
