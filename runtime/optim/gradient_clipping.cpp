#include "optim/gradient_clipping.hpp"

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>

#include "optim/nonfinite_watch.hpp"

namespace kiln {

namespace {

std::vector<at::Tensor> norms_of_grads(const std::vector<at::Tensor>& params, std::vector<at::Tensor>* grads) {
  std::vector<at::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) {
      grads->push_back(p.grad());
      norms.push_back(p.grad().norm(2));
    }
  return norms;
}

}  // namespace

void clip_gradients(const std::vector<at::Tensor>& params, const GradientClipping& clipping,
                    const std::function<at::Tensor(at::Tensor)>& reduce, NonfiniteWatch* nonfinite) {
  if (clipping.value <= 0) return;
  if (clipping.by_value) {
    torch::nn::utils::clip_grad_value_(params, clipping.value);
    return;
  }
  std::vector<at::Tensor> grads;
  const std::vector<at::Tensor> norms = norms_of_grads(params, &grads);
  if (grads.empty() && !reduce) return;
  at::Tensor total;
  if (!reduce) {
    total = at::stack(norms).norm(2);
  } else {
    // Each rank's squared norm, summed over ranks, then the root: every
    // rank clips by the same global norm. A rank without gradients adds 0.
    at::Tensor squared = norms.empty() ? at::zeros({}, at::kFloat) : at::stack(norms).square().sum();
    total = reduce(squared).sqrt();
  }
  if (nonfinite) nonfinite->add_grad_norm(total);
  const at::Tensor factor = (clipping.value / (total + 1e-6)).clamp_max(1.0);
  for (auto& g : grads) g.mul_(factor);
}

}  // namespace kiln
