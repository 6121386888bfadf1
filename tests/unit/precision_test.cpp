// optim/precision: autocast around the model's steps, and the gradient
// scaler of 16-mixed (its rules, and its state through a checkpoint). All on
// the CPU: the scaler's arithmetic is device-independent.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_parts.hpp"
#include "ckpt/tensor_sections.hpp"
#include "optim/scaler_checkpoint.hpp"
#include "support/run_process.hpp"
#include "optim/precision.hpp"

namespace kiln {
namespace {

TEST(Autocast, Bf16MixedComputesMatmulsInBfloat16OnlyInsideTheScope) {
  const at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
  {
    AutocastScope scope(Precision::bf16_mixed, c10::Device(c10::kCPU));
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    {
      AutocastScope nested(Precision::bf16_mixed, c10::Device(c10::kCPU));
      EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    }
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16) << "a nested scope leaves the outer one on";
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  {
    AutocastScope off(Precision::fp32, c10::Device(c10::kCPU));
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  }
}

at::Tensor parameter_with_grad(std::vector<float> grad) {
  at::Tensor p = at::zeros({static_cast<int64_t>(grad.size())}).requires_grad_(true);
  p.mutable_grad() = at::tensor(grad);
  return p;
}

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradientsExactly) {
  ScalerState state;
  GradScaler scaler(state);
  EXPECT_DOUBLE_EQ(scaler.scale(at::scalar_tensor(0.5)).item<double>(), 0.5 * 65536.0);
  at::Tensor p = parameter_with_grad({65536.0f, -131072.0f});
  scaler.unscale({p});
  EXPECT_TRUE(at::equal(p.grad(), at::tensor({1.0f, -2.0f})));
  EXPECT_TRUE(scaler.step_and_update());
  EXPECT_EQ(state.growth_tracker, 1);
  EXPECT_EQ(state.skipped, 0);
}

TEST(GradScaler, AStepWithAnInfOrNanGradientIsSkippedCountedAndBacksOff) {
  ScalerState state;
  GradScaler scaler(state);
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    at::Tensor good = parameter_with_grad({1.0f}), broken = parameter_with_grad({1.0f, bad});
    scaler.unscale({good, broken});
    EXPECT_FALSE(scaler.step_and_update());
  }
  EXPECT_EQ(state.skipped, 2);
  EXPECT_DOUBLE_EQ(state.scale, 65536.0 / 4);
  EXPECT_EQ(state.growth_tracker, 0);
}

TEST(GradScaler, GrowsAfterTheGrowthIntervalOfGoodSteps) {
  ScalerState state;
  state.growth_tracker = GradScaler::kGrowthInterval - 1;
  GradScaler scaler(state);
  at::Tensor p = parameter_with_grad({1.0f});
  scaler.unscale({p});
  EXPECT_TRUE(scaler.step_and_update());
  EXPECT_DOUBLE_EQ(state.scale, 65536.0 * 2);
  EXPECT_EQ(state.growth_tracker, 0);
}

// A resumed 16-mixed run scales its next loss as the interrupted one would.
TEST(GradScaler, ItsStateGoesThroughACheckpointExactly) {
  test::TempDir dir;
  NamedTensors params{{"w", at::ones({2})}};
  ModelTensorsPart params_part("param/", "parameter", params);
  ScalerState saved{1234.5678901234567, 17, 3};
  ScalerPart saved_part(saved);
  CheckpointParts out;
  out.add("param", params_part, load_priority::model);
  out.add("scaler", saved_part, load_priority::run);
  commit_checkpoint(dir / "a.ckpt", out.snapshot());

  ScalerState restored;
  ScalerPart restored_part(restored);
  CheckpointParts in;
  in.add("param", params_part, load_priority::model);
  in.add("scaler", restored_part, load_priority::run);
  in.restore(CheckpointFile::read(dir / "a.ckpt"));
  EXPECT_EQ(restored.scale, saved.scale);
  EXPECT_EQ(restored.growth_tracker, 17);
  EXPECT_EQ(restored.skipped, 3);

  // A checkpoint of another precision has none: the scaler keeps its start.
  out.remove("scaler");
  commit_checkpoint(dir / "b.ckpt", out.snapshot());
  ScalerState fresh;
  ScalerPart fresh_part(fresh);
  in.replace("scaler", fresh_part, load_priority::run);
  in.restore(CheckpointFile::read(dir / "b.ckpt"));
  EXPECT_EQ(fresh.scale, ScalerState{}.scale);
}

}  // namespace
}  // namespace kiln
