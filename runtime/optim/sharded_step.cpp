#include "optim/sharded_step.hpp"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "distributed/process_group.hpp"
#include "optim/precision.hpp"
#include "optim/weight_averaging.hpp"
#include "util/errors.hpp"

namespace kiln {

ShardedStep::ShardedStep(ReplicatedStep::Parts whole, std::vector<at::Tensor> owned, ShardLayout layout,
                         ProcessGroup* group)
    : p_(whole), whole_(whole), owned_(std::move(owned)), layout_(std::move(layout)), group_(group) {}

std::vector<at::Tensor> ShardedStep::owned_views(const std::vector<at::Tensor>& trainable, const ShardLayout& layout) {
  std::vector<at::Tensor> out;
  out.reserve(trainable.size());
  for (size_t i = 0; i < trainable.size(); ++i) {
    const at::Tensor& p = trainable[i];
    if (p.scalar_type() != at::kFloat || !p.is_contiguous() || p.device() != trainable[0].device())
      throw InputError("distributed.shard = \"optimizer\" shards float32 parameters on one device; parameter " +
                       std::to_string(i) + " is " + std::string(c10::toString(p.scalar_type())) + " on " +
                       p.device().str() + (p.is_contiguous() ? "" : ", not contiguous") +
                       " (use distributed.shard = \"none\")");
    const ShardLayout::Run run = layout.owned(i);
    // A leaf that shares the parameter's storage: the optimizer's step on it
    // is the step on those elements of the parameter.
    at::Tensor view = p.detach().view({-1}).narrow(0, run.begin, run.length);
    view.set_requires_grad(true);
    out.push_back(view);
  }
  return out;
}

void ShardedStep::step(int64_t global_step) {
  bool stepped = true;
  {
    at::NoGradGuard no_grad;
    at::AutoDispatchBelowAutograd below_autograd;
    // The whole gradients are on every rank (all-reduced inside backward):
    // unscaled and clipped as the replicated step does, so the norm and the
    // scaler's verdict are the same everywhere and need no reduction.
    NonfiniteWatch* watch = p_.scaler ? nullptr : p_.nonfinite;
    if (p_.scaler) p_.scaler->unscale(p_.trainable);
    clip_gradients(p_.trainable, p_.clipping, {}, watch);
    if (p_.scaler) stepped = p_.scaler->step_and_update();  // skipped: inf/NaN gradients (counted)
    if (stepped) {
      for (size_t i = 0; i < owned_.size(); ++i) {
        const at::Tensor& grad = p_.trainable[i].grad();
        const ShardLayout::Run run = layout_.owned(i);
        owned_[i].mutable_grad() = grad.defined() ? grad.reshape({-1}).narrow(0, run.begin, run.length) : at::Tensor();
      }
      p_.optimizer.step();
    }
  }
  clear_gradients();
  if (stepped) gather_parameters();
  if (p_.averaging) p_.averaging->after_step(global_step);
}

void ShardedStep::clear_gradients() {
  whole_.clear_gradients();
  for (auto& v : owned_)
    if (v.grad().defined()) v.mutable_grad().reset();
}

void ShardedStep::gather_parameters() {
  if (!group_ || layout_.world_size() == 1 || owned_.empty()) return;
  at::NoGradGuard no_grad;
  const at::Tensor& first = p_.trainable[0];
  at::Tensor part = at::zeros({layout_.shard_size()}, first.options().requires_grad(false));
  for (size_t i = 0; i < owned_.size(); ++i)
    if (owned_[i].numel() > 0) part.narrow(0, layout_.position_in_shard(i), owned_[i].numel()).copy_(owned_[i]);
  at::Tensor whole = at::empty({layout_.padded()}, part.options());
  group_->all_gather(part, whole, "its part of the parameters after the optimizer step");
  for (size_t i = 0; i < p_.trainable.size(); ++i)
    p_.trainable[i].detach().view({-1}).copy_(whole.narrow(0, layout_.offset(i), layout_.numel(i)));
}

}  // namespace kiln
