#include "distributed/grad_sync.hpp"

#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <ATen/ScalarOps.h>

#include "distributed/c10d_compat.hpp"
#include "distributed/process_group.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {
constexpr size_t kBucketBytes = 25u << 20;       // DDP's default bucket_cap_mb = 25
constexpr size_t kFirstBucketBytes = 1u << 20;   // DDP's first bucket: start reducing early

// DDP's fp16_compress_hook / bf16_compress_hook: the bucket, divided by the
// world size in float32 (no overflow in the sum), travels in `dtype` and is
// written back into the float32 bucket.
class CompressedAllReduce final : public c10d::CommHookInterface {
 public:
  CompressedAllReduce(c10::intrusive_ptr<c10d::ProcessGroup> group, at::ScalarType dtype)
      : group_(std::move(group)), dtype_(dtype) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor buffer = bucket.getBufferRef();
    std::vector<at::Tensor> compressed{buffer.div(static_cast<double>(group_->getSize())).to(dtype_)};
    auto reduced = group_->allreduce(compressed)->getFuture();
    return reduced->then(
        [buffer, compressed](c10::ivalue::Future& done) {
          (void)done.value();  // rethrows the all-reduce's failure
          buffer.copy_(compressed[0]);
          return c10::IValue(buffer);
        },
        c10::TensorType::get());
  }

  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  at::ScalarType dtype_;
};

// bf16-true's buckets (the model's gradients are bfloat16): each rank's
// gradient times 1/W in float32, summed in float32, the mean rounded once
// into the bucket. A bfloat16 sum would round at each of W-1 additions
// (Debian's Gloo cannot sum bfloat16 at all), and the sharded steps
// (optim/sharded_gradients.hpp) compute exactly this, so every shard mode
// keeps the same bits.
class Float32MeanOfBf16 final : public c10d::CommHookInterface {
 public:
  explicit Float32MeanOfBf16(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor buffer = bucket.getBufferRef();
    // A multiplication by a wrapped double, as the sharded steps' (not a division).
    const at::Tensor inverse = c10::scalar_to_tensor(1.0 / static_cast<double>(group_->getSize()));
    inverse.unsafeGetTensorImpl()->set_wrapped_number(true);
    std::vector<at::Tensor> wide{at::mul(buffer.to(at::kFloat), inverse)};
    auto reduced = group_->allreduce(wide)->getFuture();
    return reduced->then(
        [buffer, wide](c10::ivalue::Future& done) {
          (void)done.value();  // rethrows the all-reduce's failure
          buffer.copy_(wide[0]);
          return c10::IValue(buffer);
        },
        c10::TensorType::get());
  }

  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

}  // namespace

GradSync::GradSync(ProcessGroup& group, const std::vector<at::Tensor>& parameters,
                   const std::vector<std::string>& names, GradientCompression compression)
    : group_(&group) {
  reducer_ =
      c10d_compat::make_reducer(parameters, names, group.gradient_group(), kBucketBytes, kFirstBucketBytes);
  if (compression == GradientCompression::none) {
    if (!parameters.empty() && parameters[0].scalar_type() == at::kBFloat16)
      reducer_->register_comm_hook(std::make_unique<Float32MeanOfBf16>(group.gradient_group()));
    return;
  }
  const at::ScalarType dtype = compression == GradientCompression::bf16 ? at::kBFloat16 : at::kHalf;
  // Some Gloo builds cannot sum every dtype (Debian's LibTorch 1.13 sums no
  // bfloat16): found out here, on every rank alike, not in the first backward.
  try {
    std::vector<at::Tensor> probe{at::zeros({1}, at::TensorOptions().dtype(dtype))};
    group.gradient_group()->allreduce(probe)->wait();
  } catch (const std::exception& e) {
    throw std::runtime_error("distributed.gradient_compression = \"" + option_name(compression) + "\": the " +
                             group.gradient_transport() + " all-reduce of this LibTorch cannot sum " +
                             c10::toString(dtype) + " (" + one_line(e.what()) + "); use \"fp16\" or \"none\"");
  }
  reducer_->register_comm_hook(std::make_unique<CompressedAllReduce>(group.gradient_group(), dtype));
}

GradSync::~GradSync() = default;

std::pair<double, int64_t> GradSync::waited() const {
  const ProcessGroup::GradientWaits w = group_->gradient_waits();
  return {w.seconds, w.calls};
}

void GradSync::before_forward() { reducer_->prepare_for_forward(); }

void GradSync::before_backward(const at::Tensor& loss, bool sync) {
  if (sync) reducer_->prepare_for_backward({loss});
}

}  // namespace kiln
