#include "train/optim.hpp"

#include "train/optim_registry.hpp"

namespace kiln {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& parameters) {
  return optimizer_entry(c.name).build(c, parameters);
}

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_periods)
    : config_(config),
      base_lr_(base_lr),
      total_periods_(total_periods),
      per_step_(config.interval == SchedulerInterval::step) {}

double LrSchedule::lr(int64_t period) const {
  return schedule_entry(config_.name).lr(config_, base_lr_, total_periods_, period);
}

void LrSchedule::apply(torch::optim::Optimizer& optimizer, int64_t period) const {
  if (config_.name == SchedulerName::none) return;  // the optimizer's own rate stays, whatever it is
  const double value = lr(period);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(value);
}

}  // namespace kiln
