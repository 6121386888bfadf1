// Mixed precision, as Lightning's `precision`: the model's steps run under
// autocast (bfloat16 or float16), the backward pass and the optimizer in
// float32. float16 adds a gradient scaler. The plugin's code is the same in
// every precision: autocast is LibTorch thread state, which the host sets
// around the hook call and the plugin's operators see.
#pragma once

#include <functional>

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "config/options.hpp"
#include "loop_parts/loop_parts.hpp"
#include "optim/scaler_state.hpp"

namespace kiln {

// Autocast on `device`'s type for this scope (nothing for Precision::fp32).
// The one place that knows LibTorch's autocast API, which changed in 2.x.
class AutocastScope {
 public:
  AutocastScope(Precision precision, c10::Device device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// The model's steps under autocast; everything else passes through.
class AutocastSteps final : public StepModel {
 public:
  AutocastSteps(StepModel& inner, Precision precision, c10::Device device)
      : inner_(inner), precision_(precision), device_(device) {}
  bool has_step(kiln_split split) const override { return inner_.has_step(split); }
  at::Tensor training_step(kiln_batch& batch, int64_t batch_index) override;
  void evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) override;
  at::Tensor predict_step(kiln_batch& batch, int64_t batch_index) override;

 private:
  StepModel& inner_;
  Precision precision_;
  c10::Device device_;
};

// Every floating-point tensor of `batch` as bfloat16 (bf16-true's inputs).
void floating_to_bf16(kiln_batch& batch);

// bf16-true's steps, as Lightning's: every floating-point tensor of a batch
// becomes bfloat16 before the model's step sees it (the model's weights are
// bfloat16, and an operator of a float32 input and a bfloat16 weight would
// refuse the pair); predictions go back as float32, which every writer
// reads and which holds a bfloat16 value exactly.
class TrueBf16Steps final : public StepModel {
 public:
  explicit TrueBf16Steps(StepModel& inner) : inner_(inner) {}
  bool has_step(kiln_split split) const override { return inner_.has_step(split); }
  at::Tensor training_step(kiln_batch& batch, int64_t batch_index) override;
  void evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) override;
  at::Tensor predict_step(kiln_batch& batch, int64_t batch_index) override;

 private:
  StepModel& inner_;
};

// PyTorch's GradScaler for float16: the loss is multiplied by the scale
// before backward, the gradients divided by it before clipping and the
// optimizer step; a step whose gradients hold an inf or NaN is skipped and
// counted, and the scale backs off; after `growth_interval` good steps in a
// row it grows. Checking for inf/NaN is one read of one flag per optimizer
// step (as PyTorch's); the rest stays on the device.
class GradScaler {
 public:
  // The state lives with the run (checkpoints save and restore it there).
  explicit GradScaler(ScalerState& state) : state_(state) {}

  at::Tensor scale(const at::Tensor& loss) const { return loss * state_.scale; }
  // Divides every gradient by the scale and notes (on the device) whether
  // any is not finite.
  void unscale(const std::vector<at::Tensor>& parameters);
  // Where each rank unscaled its own gradients (a sharded step): the verdict
  // made every rank's, `sum_over_ranks` summing a count of non-finite ranks.
  void agree(const std::function<at::Tensor(at::Tensor)>& sum_over_ranks);
  // Whether the optimizer may step (reads the flag); then updates the scale.
  bool step_and_update();

  static constexpr double kGrowthFactor = 2.0, kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

 private:
  ScalerState& state_;
  at::Tensor found_inf_;
};

}  // namespace kiln
