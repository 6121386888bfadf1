// Optimizers and learning-rate schedules from the manifest. The host owns
// them: plugins expose parameters and never step an optimizer themselves.
#pragma once

#include <memory>
#include <vector>

#include <torch/optim.h>

#include "config/manifest.hpp"
#include "optim/param_groups.hpp"

namespace kiln {

// Built by the optimizer's registry entry (optim/optim_registry.hpp): one
// parameter group with `config`'s options.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<at::Tensor>& parameters);
// One torch parameter group per planned group (optim/param_groups.hpp), in
// the plan's order, each with its options; `trainable` is what the groups'
// members index.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<ParamGroup>& groups,
                                                        const std::vector<at::Tensor>& trainable);

// A multiplicative factor on the base learning rate per period (an epoch or
// an optimizer step, by `interval`), like LambdaLR: one formula per schedule,
// so that any period's rate can be computed directly (exact resume needs it).
// Each parameter group is scheduled from its own base rate, as torch's
// schedulers do from each group's initial_lr.
class LrSchedule {
 public:
  LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_periods);
  // One base rate per parameter group, in the optimizer's group order.
  LrSchedule(const SchedulerConfig& config, std::vector<double> base_lrs, int64_t total_periods);
  // The rate of `group` in `period`.
  double lr(int64_t period, size_t group = 0) const;
  bool per_step() const { return per_step_; }
  // [averaging] kind = "swa" with swa_lr: from epoch `start_epoch` on, the
  // rate moves to `swa_lr` over `annealing_epochs` epochs by a cosine (at
  // once with 0), from the schedule's rate (SWALR's rule). Epoch periods only.
  void anneal_to(double swa_lr, int64_t start_epoch, int64_t annealing_epochs);
  // Sets every parameter group's learning rate for `period`. With a single
  // base rate, every group gets it.
  void apply(torch::optim::Optimizer& optimizer, int64_t period) const;

 private:
  SchedulerConfig config_;
  std::vector<double> base_lrs_;
  int64_t total_periods_;
  bool per_step_;
  double swa_lr_ = 0;  // 0: no SWA rate
  int64_t swa_start_ = 0, swa_annealing_ = 0;
};

}  // namespace kiln
