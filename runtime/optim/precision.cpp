#include "optim/precision.hpp"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "plugin/host_objects.hpp"

namespace kiln {

namespace {

// LibTorch 2.4 made autocast's switches per device type; 1.13 had one pair
// of functions for the CPU and one for CUDA.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
void set_autocast_enabled(c10::DeviceType type, bool on) { at::autocast::set_autocast_enabled(type, on); }
at::ScalarType autocast_dtype(c10::DeviceType type) { return at::autocast::get_autocast_dtype(type); }
void set_autocast_dtype(c10::DeviceType type, at::ScalarType dtype) { at::autocast::set_autocast_dtype(type, dtype); }
#else
bool autocast_enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void set_autocast_enabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
}
at::ScalarType autocast_dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
void set_autocast_dtype(c10::DeviceType type, at::ScalarType dtype) {
  if (type == c10::DeviceType::CPU)
    at::autocast::set_autocast_cpu_dtype(dtype);
  else
    at::autocast::set_autocast_gpu_dtype(dtype);
}
#endif

}  // namespace

AutocastScope::AutocastScope(Precision precision, c10::Device device) : type_(device.type()) {
  if (precision == Precision::fp32 || precision == Precision::bf16_true) return;
  active_ = true;
  was_enabled_ = autocast_enabled(type_);
  was_dtype_ = autocast_dtype(type_);
  set_autocast_enabled(type_, true);
  set_autocast_dtype(type_, precision == Precision::bf16_mixed ? at::kBFloat16 : at::kHalf);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // As torch.autocast's __exit__: the cast weights are cached for the
  // outermost scope only, and freed when it ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(type_, was_enabled_);
  set_autocast_dtype(type_, was_dtype_);
}

at::Tensor AutocastSteps::training_step(kiln_batch& batch, int64_t batch_index) {
  AutocastScope autocast(precision_, device_);
  return inner_.training_step(batch, batch_index);
}

void AutocastSteps::evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) {
  AutocastScope autocast(precision_, device_);
  inner_.evaluation_step(split, batch, batch_index);
}

at::Tensor AutocastSteps::predict_step(kiln_batch& batch, int64_t batch_index) {
  AutocastScope autocast(precision_, device_);
  return inner_.predict_step(batch, batch_index);
}

void floating_to_bf16(kiln_batch& batch) {
  for (auto& [name, tensor] : batch.tensors)
    if (tensor.defined() && at::isFloatingType(tensor.scalar_type()) && tensor.scalar_type() != at::kBFloat16)
      tensor = tensor.to(at::kBFloat16);
}

at::Tensor TrueBf16Steps::training_step(kiln_batch& batch, int64_t batch_index) {
  floating_to_bf16(batch);
  return inner_.training_step(batch, batch_index);
}

void TrueBf16Steps::evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) {
  floating_to_bf16(batch);
  inner_.evaluation_step(split, batch, batch_index);
}

at::Tensor TrueBf16Steps::predict_step(kiln_batch& batch, int64_t batch_index) {
  floating_to_bf16(batch);
  at::Tensor out = inner_.predict_step(batch, batch_index);
  return out.defined() && out.scalar_type() == at::kBFloat16 ? out.to(at::kFloat) : out;
}

void GradScaler::unscale(const std::vector<at::Tensor>& parameters) {
  const double inverse = 1.0 / state_.scale;
  found_inf_ = at::Tensor();
  for (const auto& p : parameters) {
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    grad.mul_(inverse);
    at::Tensor bad = at::isfinite(grad).all().logical_not();
    found_inf_ = found_inf_.defined() ? found_inf_.logical_or(bad) : bad;
  }
}

void GradScaler::agree(const std::function<at::Tensor(at::Tensor)>& sum_over_ranks) {
  const at::Tensor mine = found_inf_.defined() ? found_inf_.to(at::kFloat) : at::zeros({}, at::kFloat);
  found_inf_ = sum_over_ranks(mine).gt(0);
}

bool GradScaler::step_and_update() {
  const bool finite = !found_inf_.defined() || !found_inf_.item<bool>();
  found_inf_ = at::Tensor();
  if (!finite) {
    ++state_.skipped;
    state_.scale *= kBackoffFactor;
    state_.growth_tracker = 0;
  } else if (++state_.growth_tracker == kGrowthInterval) {
    state_.scale *= kGrowthFactor;
    state_.growth_tracker = 0;
  }
  return finite;
}

}  // namespace kiln
