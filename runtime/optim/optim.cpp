#include "optim/optim.hpp"

#include <algorithm>
#include <cmath>

#include <stdexcept>
#include <string>

#include "optim/optim_registry.hpp"

namespace kiln {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& parameters) {
  return optimizer_entry(c.name).build({OptimizerGroup{parameters, c}}, c);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c, const std::vector<ParamGroup>& groups,
                                                        const std::vector<at::Tensor>& trainable) {
  std::vector<OptimizerGroup> built;
  for (const ParamGroup& g : groups) {
    OptimizerGroup group{{}, g.options};
    for (size_t i : g.members) group.params.push_back(trainable.at(i));
    built.push_back(std::move(group));
  }
  return optimizer_entry(c.name).build(built, c);
}

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_periods)
    : LrSchedule(config, std::vector<double>{base_lr}, total_periods) {}

LrSchedule::LrSchedule(const SchedulerConfig& config, std::vector<double> base_lrs, int64_t total_periods)
    : config_(config),
      base_lrs_(std::move(base_lrs)),
      total_periods_(total_periods),
      per_step_(config.interval == SchedulerInterval::step) {
  if (base_lrs_.empty()) throw std::logic_error("LrSchedule needs a base learning rate");
}

void LrSchedule::anneal_to(double swa_lr, int64_t start_epoch, int64_t annealing_epochs) {
  swa_lr_ = swa_lr;
  swa_start_ = start_epoch;
  swa_annealing_ = annealing_epochs;
}

double LrSchedule::lr(int64_t period, size_t group) const {
  const double scheduled = schedule_entry(config_.name).lr(config_, base_lrs_.at(group), total_periods_, period);
  if (swa_lr_ <= 0 || period < swa_start_) return scheduled;
  const double t =
      swa_annealing_ > 0 ? std::min(1.0, static_cast<double>(period - swa_start_ + 1) / static_cast<double>(swa_annealing_))
                         : 1.0;
  const double alpha = (1.0 - std::cos(M_PI * t)) / 2.0;
  return swa_lr_ * alpha + scheduled * (1.0 - alpha);
}

void LrSchedule::apply(torch::optim::Optimizer& optimizer, int64_t period) const {
  // Without a schedule the optimizer's own rates stay, whatever they are.
  if (config_.name == SchedulerName::none && swa_lr_ <= 0) return;
  auto& groups = optimizer.param_groups();
  if (base_lrs_.size() != 1 && base_lrs_.size() != groups.size())
    throw std::logic_error("LrSchedule has " + std::to_string(base_lrs_.size()) + " base rates for " +
                           std::to_string(groups.size()) + " parameter groups");
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lr(period, base_lrs_.size() == 1 ? 0 : i));
}

}  // namespace kiln
