#include "optim/sharded_gradients.hpp"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distributed/process_group.hpp"

namespace kiln {

namespace {

constexpr int64_t kBucketBytes = int64_t{25} << 20;     // DDP's bucket_cap_mb = 25
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;  // DDP's first bucket: start reducing early

}  // namespace

ShardedGradients::ShardedGradients(const std::vector<at::Tensor>& trainable, const ShardLayout& layout,
                                   ProcessGroup* group, bool free_reduced, at::ScalarType owned_dtype)
    : params_(trainable),
      layout_(layout),
      group_(group),
      free_reduced_(free_reduced),
      inverse_world_(1.0 / static_cast<double>(layout.world_size())),
      bucket_of_(trainable.size()) {
  owned_ = at::zeros({layout.shard_size()}, trainable.empty() ? at::TensorOptions(owned_dtype)
                                                               : trainable[0].options().dtype(owned_dtype).requires_grad(false));
  // From the last parameter back, whole parameters, as DDP fills its buckets.
  int64_t cap = kFirstBucketBytes, bytes = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    if (buckets_.empty() || bytes >= cap) {
      if (!buckets_.empty()) cap = kBucketBytes;
      buckets_.push_back(Bucket{i + 1, i + 1});
      bytes = 0;
    }
    buckets_.back().first = i;
    bytes += params_[i].numel() * static_cast<int64_t>(sizeof(float));
    bucket_of_[i] = buckets_.size() - 1;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    const uintptr_t key = accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          ready(i);
          return outputs;
        }));
    unhook_.push_back([accumulator, key] { accumulator->del_post_hook(key); });
  }
}

ShardedGradients::~ShardedGradients() {
  for (auto& unhook : unhook_) unhook();
}

void ShardedGradients::before_backward(bool sync) {
  armed_ = sync || free_reduced_;
  if (!armed_) return;
  accumulate_ = reduced_;
  next_ = 0;
  for (Bucket& b : buckets_) b.pending = static_cast<int64_t>(b.last - b.first);
}

void ShardedGradients::ready(size_t parameter) {
  if (!armed_) return;
  Bucket& bucket = buckets_[bucket_of_[parameter]];
  if (--bucket.pending != 0) return;
  // In order on every rank: a bucket ready early waits for those before it.
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) reduce(buckets_[next_++]);
}

void ShardedGradients::after_backward() {
  if (!armed_) return;
  // Buckets with a parameter that got no gradient (it contributes zeros).
  while (next_ < buckets_.size()) reduce(buckets_[next_++]);
  // bf16-true's float32 masters: the mean is a bfloat16 gradient, as the
  // parameter's, rounded once, as the replicated buckets round it (owned
  // sums in bfloat16 were rounded as they landed).
  if (!params_.empty() && params_[0].scalar_type() == at::kBFloat16 && owned_.scalar_type() == at::kFloat) {
    at::NoGradGuard no_grad;
    owned_.copy_(owned_.to(at::kBFloat16));
  }
  armed_ = false;
  reduced_ = true;
}

void ShardedGradients::reduce(Bucket& bucket) {
  at::NoGradGuard no_grad;
  const int64_t begin = layout_.offset(bucket.first);
  const int64_t end = layout_.offset(bucket.last - 1) + layout_.numel(bucket.last - 1);
  // Gradient times 1/W into the place given, as the Reducer divides into
  // its bucket (a multiplication by a wrapped double, not a division).
  const at::Tensor inverse = c10::scalar_to_tensor(inverse_world_);
  inverse.unsafeGetTensorImpl()->set_wrapped_number(true);
  auto fill = [&](int64_t first, at::Tensor& place) {
    const int64_t until = first + place.numel();
    for (size_t i = bucket.first; i < bucket.last; ++i) {
      const int64_t lo = std::max(first, layout_.offset(i)), hi = std::min(until, layout_.offset(i) + layout_.numel(i));
      if (hi <= lo) continue;
      at::Tensor into = place.narrow(0, lo - first, hi - lo);
      const at::Tensor& grad = params_[i].grad();
      // A bfloat16 gradient (bf16-true) is multiplied in float32, as the
      // replicated buckets' (distributed/grad_sync.cpp).
      if (grad.defined())
        at::mul_out(into, grad.reshape({-1}).narrow(0, lo - layout_.offset(i), hi - lo).to(at::kFloat), inverse);
      else
        into.zero_();
    }
  };
  if (group_ && layout_.world_size() > 1) {
    group_->reduce_scatter(begin, end - begin, layout_.shard_size(), fill, owned_, accumulate_, "its gradients");
  } else {
    // One rank owns everything: its gradients are the sums.
    at::Tensor range = owned_.narrow(0, begin, end - begin);
    if (accumulate_ || range.scalar_type() != at::kFloat) {
      at::Tensor sum = at::empty(range.sizes(), range.options().dtype(at::kFloat));
      fill(begin, sum);
      if (accumulate_)
        range.add_(sum);
      else
        range.copy_(sum);
    } else {
      fill(begin, range);
    }
  }
  if (free_reduced_)
    for (size_t i = bucket.first; i < bucket.last; ++i)
      if (params_[i].grad().defined()) params_[i].mutable_grad().reset();
}

at::Tensor ShardedGradients::owned_gradient(size_t i) const {
  if (!reduced_) return {};
  const ShardLayout::Run run = layout_.owned(i);
  return owned_.narrow(0, run.length ? layout_.position_in_shard(i) : 0, run.length);
}

void ShardedGradients::clear() {
  reduced_ = false;
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().reset();
}

}  // namespace kiln
