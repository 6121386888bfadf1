#include "optim/optim_registry.hpp"

#include <cmath>
#include <stdexcept>
#include <typeinfo>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "optim/fused_adam.hpp"

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

// RMSprop's state; momentum_buffer and grad_avg exist only with momentum
// and centered. The empty "rmsprop" field marks the kind.
ParamStateFields save_rmsprop_state(const torch::optim::OptimizerParamState& base) {
  const auto& state = static_cast<const torch::optim::RMSpropParamState&>(base);
  ParamStateFields fields;
  fields.texts.emplace_back("rmsprop", "");
  fields.texts.emplace_back("step", std::to_string(state.step()));
  fields.tensors.emplace_back("square_avg", state.square_avg());
  if (state.momentum_buffer().defined()) fields.tensors.emplace_back("momentum_buffer", state.momentum_buffer());
  if (state.grad_avg().defined()) fields.tensors.emplace_back("grad_avg", state.grad_avg());
  return fields;
}

std::unique_ptr<torch::optim::OptimizerParamState> load_rmsprop_state(const ParamStateReader& fields) {
  auto state = std::make_unique<torch::optim::RMSpropParamState>();
  state->step(fields.count("step"));
  state->square_avg(fields.tensor("square_avg"));
  if (fields.has("momentum_buffer")) state->momentum_buffer(fields.tensor("momentum_buffer"));
  if (fields.has("grad_avg")) state->grad_avg(fields.tensor("grad_avg"));
  return state;
}

// Adagrad's state: the squared gradients' sum and the step (lr_decay).
ParamStateFields save_adagrad_state(const torch::optim::OptimizerParamState& base) {
  const auto& state = static_cast<const torch::optim::AdagradParamState&>(base);
  ParamStateFields fields;
  fields.texts.emplace_back("adagrad", "");
  fields.texts.emplace_back("step", std::to_string(state.step()));
  fields.tensors.emplace_back("sum", state.sum());
  return fields;
}

std::unique_ptr<torch::optim::OptimizerParamState> load_adagrad_state(const ParamStateReader& fields) {
  auto state = std::make_unique<torch::optim::AdagradParamState>();
  state->step(fields.count("step"));
  state->sum(fields.tensor("sum"));
  return state;
}

// Each group with its own options object; torch clones `defaults` only for
// groups that have none.
template <class Optim, class Options>
std::unique_ptr<torch::optim::Optimizer> build_groups(const std::vector<OptimizerGroup>& groups,
                                                      const OptimizerConfig& defaults,
                                                      Options (*options)(const OptimizerConfig&)) {
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (const auto& g : groups)
    param_groups.emplace_back(g.params, std::make_unique<Options>(options(g.options)));
  return std::make_unique<Optim>(std::move(param_groups), options(defaults));
}

torch::optim::SGDOptions sgd_options(const OptimizerConfig& c) {
  return torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay);
}
torch::optim::AdamOptions adam_options(const OptimizerConfig& c) {
  return torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay);
}
torch::optim::AdamWOptions adamw_options(const OptimizerConfig& c) {
  return torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay);
}
torch::optim::RMSpropOptions rmsprop_options(const OptimizerConfig& c) {
  return torch::optim::RMSpropOptions(c.lr)
      .alpha(c.alpha)
      .eps(c.eps)
      .weight_decay(c.weight_decay)
      .momentum(c.momentum)
      .centered(c.centered);
}
torch::optim::AdagradOptions adagrad_options(const OptimizerConfig& c) {
  return torch::optim::AdagradOptions(c.lr)
      .lr_decay(c.lr_decay)
      .weight_decay(c.weight_decay)
      .initial_accumulator_value(c.initial_accumulator_value)
      .eps(c.eps);
}

std::unique_ptr<torch::optim::Optimizer> build_sgd(const std::vector<OptimizerGroup>& g, const OptimizerConfig& d) {
  return build_groups<torch::optim::SGD>(g, d, sgd_options);
}
std::unique_ptr<torch::optim::Optimizer> build_adam(const std::vector<OptimizerGroup>& g, const OptimizerConfig& d) {
  if (d.fused) return build_groups<FusedAdam>(g, d, adam_options);
  return build_groups<torch::optim::Adam>(g, d, adam_options);
}
std::unique_ptr<torch::optim::Optimizer> build_adamw(const std::vector<OptimizerGroup>& g, const OptimizerConfig& d) {
  if (d.fused) return build_groups<FusedAdamW>(g, d, adamw_options);
  return build_groups<torch::optim::AdamW>(g, d, adamw_options);
}
std::unique_ptr<torch::optim::Optimizer> build_rmsprop(const std::vector<OptimizerGroup>& g, const OptimizerConfig& d) {
  return build_groups<torch::optim::RMSprop>(g, d, rmsprop_options);
}

// LibTorch's Adagrad fills every parameter's sum with the *defaults'*
// initial_accumulator_value when it is constructed; each group's own value
// is what torch.optim.Adagrad uses, so the sums are filled again per group.
std::unique_ptr<torch::optim::Optimizer> build_adagrad(const std::vector<OptimizerGroup>& g, const OptimizerConfig& d) {
  auto optimizer = build_groups<torch::optim::Adagrad>(g, d, adagrad_options);
  at::NoGradGuard no_grad;
  for (auto& group : optimizer->param_groups()) {
    const double initial = static_cast<torch::optim::AdagradOptions&>(group.options()).initial_accumulator_value();
    for (const auto& p : group.params()) {
      auto state = std::make_unique<torch::optim::AdagradParamState>();
      state->step(0);
      state->sum(torch::full_like(p.data(), initial, at::MemoryFormat::Preserve));
      optimizer->state()[optimizer_state_key(p)] = std::move(state);
    }
  }
  return optimizer;
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
      {OptimizerName::rmsprop, typeid(torch::optim::RMSprop), "RMSprop", "rmsprop", build_rmsprop, save_rmsprop_state,
       load_rmsprop_state},
      {OptimizerName::adagrad, typeid(torch::optim::Adagrad), "Adagrad", "adagrad", build_adagrad, save_adagrad_state,
       load_adagrad_state},
  }};
  return registry;
}

const OptimizerEntry& optimizer_entry(OptimizerName name) {
  const OptimizerEntry& entry = optimizer_registry().at(static_cast<std::size_t>(name));
  if (entry.name != name) throw std::logic_error("optimizer registry out of OptimizerName order at " + option_name(name));
  return entry;
}

const OptimizerEntry* optimizer_entry_of(const torch::optim::Optimizer& optimizer) {
  // optimizer.fused: the same optimizer, its state LibTorch's.
  if (typeid(optimizer) == typeid(FusedAdam)) return &optimizer_entry(OptimizerName::adam);
  if (typeid(optimizer) == typeid(FusedAdamW)) return &optimizer_entry(OptimizerName::adamw);
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
