#include "train/optim_registry.hpp"

#include <cmath>
#include <stdexcept>
#include <typeinfo>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace kiln {

namespace {

// ---- optimizers

// Adam and AdamW keep the same per-parameter state; their checkpoints read
// the same (sections step, exp_avg, exp_avg_sq, max_exp_avg_sq).
template <class State>
ParamStateFields save_adam_state(const torch::optim::OptimizerParamState& base) {
  const auto& state = static_cast<const State&>(base);
  ParamStateFields fields;
  fields.texts.emplace_back("step", std::to_string(state.step()));
  fields.tensors.emplace_back("exp_avg", state.exp_avg());
  fields.tensors.emplace_back("exp_avg_sq", state.exp_avg_sq());
  if (state.max_exp_avg_sq().defined()) fields.tensors.emplace_back("max_exp_avg_sq", state.max_exp_avg_sq());
  return fields;
}

template <class State>
std::unique_ptr<torch::optim::OptimizerParamState> load_adam_state(const ParamStateReader& fields) {
  auto state = std::make_unique<State>();
  state->step(fields.count("step"));
  state->exp_avg(fields.tensor("exp_avg"));
  state->exp_avg_sq(fields.tensor("exp_avg_sq"));
  if (fields.has("max_exp_avg_sq")) state->max_exp_avg_sq(fields.tensor("max_exp_avg_sq"));
  return state;
}

// SGD's state is its momentum buffer, absent without momentum: the empty
// "sgd" field marks that the state exists.
ParamStateFields save_sgd_state(const torch::optim::OptimizerParamState& base) {
  const auto& state = static_cast<const torch::optim::SGDParamState&>(base);
  ParamStateFields fields;
  if (state.momentum_buffer().defined()) fields.tensors.emplace_back("momentum_buffer", state.momentum_buffer());
  fields.texts.emplace_back("sgd", "");
  return fields;
}

std::unique_ptr<torch::optim::OptimizerParamState> load_sgd_state(const ParamStateReader& fields) {
  auto state = std::make_unique<torch::optim::SGDParamState>();
  if (fields.has("momentum_buffer")) state->momentum_buffer(fields.tensor("momentum_buffer"));
  return state;
}

std::unique_ptr<torch::optim::Optimizer> build_sgd(const OptimizerConfig& c, const std::vector<at::Tensor>& parameters) {
  return std::make_unique<torch::optim::SGD>(
      parameters, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
}

std::unique_ptr<torch::optim::Optimizer> build_adam(const OptimizerConfig& c, const std::vector<at::Tensor>& parameters) {
  return std::make_unique<torch::optim::Adam>(
      parameters, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
}

std::unique_ptr<torch::optim::Optimizer> build_adamw(const OptimizerConfig& c, const std::vector<at::Tensor>& parameters) {
  return std::make_unique<torch::optim::AdamW>(
      parameters, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
}

// ---- schedules: the learning rate of `period`

double constant_lr(const SchedulerConfig&, double base_lr, int64_t, int64_t) { return base_lr; }

double step_lr(const SchedulerConfig& c, double base_lr, int64_t, int64_t period) {
  return base_lr * std::pow(c.gamma, static_cast<double>(period / std::max<int64_t>(1, c.step_size)));
}

double cosine_lr(const SchedulerConfig& c, double base_lr, int64_t total_periods, int64_t period) {
  const int64_t t_max = c.t_max > 0 ? c.t_max : std::max<int64_t>(1, total_periods);
  const double t = static_cast<double>(std::min(period, t_max));
  return c.eta_min + (base_lr - c.eta_min) * (1 + std::cos(M_PI * t / t_max)) / 2;
}

double linear_warmup_lr(const SchedulerConfig& c, double base_lr, int64_t, int64_t period) {
  if (c.warmup_steps <= 0 || period >= c.warmup_steps) return base_lr;
  const double s = c.warmup_start_factor;
  return base_lr * (s + (1.0 - s) * static_cast<double>(period) / c.warmup_steps);
}

}  // namespace

const OptimizerRegistry& optimizer_registry() {
  static const OptimizerRegistry registry{{
      {OptimizerName::sgd, typeid(torch::optim::SGD), "SGD", "sgd", build_sgd, save_sgd_state, load_sgd_state},
      {OptimizerName::adam, typeid(torch::optim::Adam), "Adam", "step", build_adam,
       save_adam_state<torch::optim::AdamParamState>, load_adam_state<torch::optim::AdamParamState>},
      {OptimizerName::adamw, typeid(torch::optim::AdamW), "Adam", "step", build_adamw,
       save_adam_state<torch::optim::AdamWParamState>, load_adam_state<torch::optim::AdamWParamState>},
  }};
  return registry;
}

const OptimizerEntry& optimizer_entry(OptimizerName name) {
  const OptimizerEntry& entry = optimizer_registry().at(static_cast<std::size_t>(name));
  if (entry.name != name) throw std::logic_error("optimizer registry out of OptimizerName order at " + option_name(name));
  return entry;
}

const OptimizerEntry* optimizer_entry_of(const torch::optim::Optimizer& optimizer) {
  for (const auto& entry : optimizer_registry()) {
    if (entry.type == typeid(optimizer)) return &entry;
  }
  return nullptr;
}

const ScheduleRegistry& schedule_registry() {
  static const ScheduleRegistry registry{{
      {SchedulerName::none, constant_lr},
      {SchedulerName::step, step_lr},
      {SchedulerName::cosine, cosine_lr},
      {SchedulerName::linear_warmup, linear_warmup_lr},
  }};
  return registry;
}

const ScheduleEntry& schedule_entry(SchedulerName name) {
  const ScheduleEntry& entry = schedule_registry().at(static_cast<std::size_t>(name));
  if (entry.name != name) throw std::logic_error("schedule registry out of SchedulerName order at " + option_name(name));
  return entry;
}

}  // namespace kiln
