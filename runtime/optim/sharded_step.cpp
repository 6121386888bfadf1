#include "optim/sharded_step.hpp"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "distributed/process_group.hpp"
#include "optim/nonfinite_watch.hpp"
#include "optim/precision.hpp"
#include "optim/sharded_parameters.hpp"
#include "profiling/profiler.hpp"
#include "optim/weight_averaging.hpp"
#include "util/errors.hpp"

namespace kiln {

ShardedStep::ShardedStep(ReplicatedStep::Parts whole, std::vector<at::Tensor> owned, const ShardLayout& layout,
                         ProcessGroup* group, bool free_gradients, bool masters, ShardedParameters* parameters)
    : p_(whole),
      owned_(std::move(owned)),
      layout_(layout),
      group_(group),
      masters_(masters),
      parameters_(parameters),
      // The sums in the dtype the optimizer steps (float32 masters, or the weights).
      gradients_(whole.trainable, layout, group, free_gradients,
                 owned_.empty() ? at::kFloat : owned_[0].scalar_type()) {}

std::vector<at::Tensor> ShardedStep::owned_views(const std::vector<at::Tensor>& trainable, const ShardLayout& layout,
                                                 bool any_dtype) {
  std::vector<at::Tensor> out;
  out.reserve(trainable.size());
  for (size_t i = 0; i < trainable.size(); ++i) {
    const at::Tensor& p = trainable[i];
    if ((!any_dtype && p.scalar_type() != at::kFloat) || !p.is_contiguous() || p.device() != trainable[0].device())
      throw InputError("distributed.shard shards float32 parameters on one device; parameter " +
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

void ShardedStep::backward(const at::Tensor& loss, bool sync) {
  const at::Tensor scaled = p_.scaler ? p_.scaler->scale(loss) : loss;
  gradients_.before_backward(sync);
  Profiler* profiler = p_.profiler;
  const ProcessGroup::GradientWaits before = profiler && group_ ? group_->gradient_waits() : ProcessGroup::GradientWaits{};
  // The reduce-scatter runs inside backward (its hooks): its failures are a peer's.
  try {
    scaled.backward();
  } catch (const PeerFailure&) {
    throw;
  } catch (const c10::Error& e) {
    throw PeerFailure(std::string("gradient reduce-scatter failed (another rank failed or stopped responding): ") +
                      e.what_without_backtrace());
  }
  gradients_.after_backward();
  if (parameters_) {
    parameters_->release_all();
    parameters_->check();
  }
  if (profiler && group_) {
    const ProcessGroup::GradientWaits after = group_->gradient_waits();
    profiler->carve(Phase::allreduce_wait, after.seconds - before.seconds, after.calls - before.calls);
  }
}

at::Tensor ShardedStep::sum_over_ranks(at::Tensor value, const char* what) const {
  if (!group_ || layout_.world_size() == 1) return value;
  at::Tensor on_cpu = value.to(at::kCPU, at::kFloat).contiguous();
  group_->all_reduce_sum(on_cpu, what);
  return on_cpu.to(value.device());
}

void ShardedStep::step(int64_t global_step) {
  bool stepped = true;
  // The step writes the shard that gathers read: nothing may be on its way
  // (a fetch ahead) while it does, nor stay whole past it with the values
  // from before (a hook's read since backward): both are freed first.
  if (parameters_) parameters_->release_all();
  {
    at::NoGradGuard no_grad;
    at::AutoDispatchBelowAutograd below_autograd;
    for (size_t i = 0; i < owned_.size(); ++i) owned_[i].mutable_grad() = gradients_.owned_gradient(i);
    NonfiniteWatch* watch = p_.scaler ? nullptr : p_.nonfinite;
    if (p_.scaler) {
      // Every rank skips the step or none does: the verdicts are summed.
      p_.scaler->unscale(owned_);
      p_.scaler->agree([this](at::Tensor found) { return sum_over_ranks(found, "its gradient scaler's verdict"); });
    }
    std::function<at::Tensor(at::Tensor)> reduce;
    if (group_ && layout_.world_size() > 1)
      reduce = [this](at::Tensor squared) { return sum_over_ranks(squared, "its squared gradient norm"); };
    clip_gradients(owned_, p_.clipping, reduce, watch);
    if (p_.scaler) stepped = p_.scaler->step_and_update();  // skipped: inf/NaN gradients (counted)
    if (stepped) p_.optimizer.step();
  }
  clear_gradients();
  if (stepped && parameters_ && masters_)
    parameters_->round_into_shard(owned_);
  else if (stepped && !parameters_)
    gather_parameters();
  if (p_.averaging) p_.averaging->after_step(global_step);
}

void ShardedStep::clear_gradients() {
  gradients_.clear();
  for (auto& v : owned_)
    if (v.grad().defined()) v.mutable_grad().reset();
}

void copy_flat(const std::vector<at::Tensor>& params, const ShardLayout& layout, int64_t begin, at::Tensor flat,
               bool into_params) {
  const int64_t end = begin + flat.numel();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) continue;  // a parameter without this state
    const int64_t lo = std::max(begin, layout.offset(i)), hi = std::min(end, layout.offset(i) + layout.numel(i));
    if (hi <= lo) continue;
    at::Tensor in_param = params[i].detach().view({-1}).narrow(0, lo - layout.offset(i), hi - lo);
    at::Tensor in_flat = flat.narrow(0, lo - begin, hi - lo);
    if (into_params)
      in_param.copy_(in_flat);
    else
      in_flat.copy_(in_param);
  }
}

// In chunks of at most kGatherChunk values a rank, so what the all-gather
// needs besides the parameters is bounded (Gloo's all-gather stages every
// rank's chunk in a buffer of its own, then copies it out). The values
// travel as float32 (the owned elements', or bf16-true's masters, rounded
// into the parameters as they land).
void ShardedStep::gather_parameters() {
  if (owned_.empty()) return;
  const int64_t world = group_ ? layout_.world_size() : 1;
  if (world == 1 && !masters_) return;  // the owned views are the parameters
  at::NoGradGuard no_grad;
  const int64_t shard = layout_.shard_size(), rank = layout_.rank();
  const at::TensorOptions options = p_.trainable[0].options().dtype(at::kFloat).requires_grad(false);
  for (int64_t at = 0; at < shard; at += kShardGatherChunk) {
    const int64_t length = std::min(kShardGatherChunk, shard - at);
    // This rank's elements [at, at + length) of its shard, from its owned runs.
    at::Tensor part = at::zeros({length}, options);
    for (size_t i = 0; i < owned_.size(); ++i) {
      const int64_t n = owned_[i].numel();
      if (n == 0) continue;
      const int64_t pos = layout_.position_in_shard(i);
      const int64_t lo = std::max(at, pos), hi = std::min(at + length, pos + n);
      if (hi > lo) part.narrow(0, lo - at, hi - lo).copy_(owned_[i].narrow(0, lo - pos, hi - lo));
    }
    at::Tensor every = part;
    if (world > 1) {
      every = at::empty({world * length}, options);
      group_->all_gather(part, every, "its part of the parameters after the optimizer step");
    }
    for (int64_t r = 0; r < world; ++r)
      if (r != rank || masters_) copy_flat(p_.trainable, layout_, r * shard + at, every.narrow(0, r * length, length), true);
  }
}

}  // namespace kiln
