#include "train/optim.hpp"

#include <cmath>
#include <stdexcept>

namespace kiln {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& parameters) {
  if (c.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        parameters,
        torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
  }
  if (c.name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        parameters,
        torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  }
  if (c.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        parameters,
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  }
  throw std::invalid_argument("unknown optimizer '" + c.name + "'");
}

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_periods)
    : config_(config), base_lr_(base_lr), total_periods_(total_periods), per_step_(config.interval == "step") {}

double LrSchedule::lr(int64_t period) const {
  const std::string& name = config_.name;
  if (name == "step") {
    return base_lr_ * std::pow(config_.gamma, static_cast<double>(period / std::max<int64_t>(1, config_.step_size)));
  }
  if (name == "cosine") {
    const int64_t t_max = config_.t_max > 0 ? config_.t_max : std::max<int64_t>(1, total_periods_);
    const double t = static_cast<double>(std::min(period, t_max));
    return config_.eta_min + (base_lr_ - config_.eta_min) * (1 + std::cos(M_PI * t / t_max)) / 2;
  }
  if (name == "linear_warmup") {
    if (config_.warmup_steps <= 0 || period >= config_.warmup_steps) return base_lr_;
    const double s = config_.warmup_start_factor;
    return base_lr_ * (s + (1.0 - s) * static_cast<double>(period) / config_.warmup_steps);
  }
  return base_lr_;
}

void LrSchedule::apply(torch::optim::Optimizer& optimizer, int64_t period) const {
  if (config_.name == "none") return;
  const double value = lr(period);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(value);
}

}  // namespace kiln
