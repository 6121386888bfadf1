#include "optim/master_weights.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "optim/sharded_step.hpp"

namespace kiln {

namespace {

// A leaf the optimizer may hold: LibTorch's optimizers step any tensor
// with a gradient, but a leaf that requires one is what they are given.
at::Tensor leaf(at::Tensor t) {
  t.set_requires_grad(true);
  return t;
}

}  // namespace

std::vector<at::Tensor> whole_masters(const std::vector<at::Tensor>& model) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  out.reserve(model.size());
  for (const auto& p : model) out.push_back(leaf(p.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)));
  return out;
}

std::vector<at::Tensor> owned_masters(const std::vector<at::Tensor>& model, const ShardLayout& layout) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out = ShardedStep::owned_views(model, layout, /*any_dtype=*/true);
  for (auto& view : out) view = leaf(view.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
  return out;
}

void gradients_to_masters(const std::vector<at::Tensor>& model, const std::vector<at::Tensor>& masters) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model.size(); ++i) {
    const at::Tensor& grad = model[i].grad();
    if (!grad.defined()) continue;  // the master's is undefined too: every step clears it
    at::Tensor master = masters[i];
    master.mutable_grad() = grad.to(at::kFloat);
    model[i].mutable_grad().reset();
  }
}

void masters_to_model(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& model) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model.size(); ++i) model[i].detach().copy_(masters[i]);
}

}  // namespace kiln
