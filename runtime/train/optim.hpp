// Optimizers and learning-rate schedules from the manifest. The host owns
// them: plugins expose parameters and never step an optimizer themselves.
#pragma once

#include <memory>
#include <vector>

#include <torch/optim.h>

#include "config/manifest.hpp"

namespace kiln {

// Built by the optimizer's registry entry (train/optim_registry.hpp).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<at::Tensor>& parameters);

// A multiplicative factor on the base learning rate per period (an epoch or
// an optimizer step, by `interval`), like LambdaLR: one formula per schedule,
// so that any period's rate can be computed directly (exact resume needs it).
class LrSchedule {
 public:
  LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_periods);
  double lr(int64_t period) const;
  bool per_step() const { return per_step_; }
  // Sets every parameter group's learning rate for `period`.
  void apply(torch::optim::Optimizer& optimizer, int64_t period) const;

 private:
  SchedulerConfig config_;
  double base_lr_;
  int64_t total_periods_;
  bool per_step_;
};

}  // namespace kiln
