#include "optim/weight_averaging.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

namespace kiln {

WeightAveraging::WeightAveraging(const AveragingConfig& config, int64_t max_epochs, const NamedTensors& params,
                                 const NamedTensors& buffers)
    : config_(config), swa_start_(swa_start_epoch(config, max_epochs)) {
  state_.kind = option_name(config.kind);
  for (const auto* list : {&params, &buffers})
    for (const auto& [name, tensor] : *list) {
      if (!tensor.is_floating_point()) continue;  // counters: the model's own
      live_.push_back(tensor);
      state_.tensors.emplace_back((list == &params ? "param/" : "buffer/") + name, tensor.detach().clone());
    }
}

void WeightAveraging::restart_from_model() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) state_.tensors[i].second.copy_(live_[i]);
  state_.count = 0;
}

void WeightAveraging::begin_fit(bool resumed) {
  const bool other_kind = state_.restored && !state_.restored_kind.empty() && state_.restored_kind != state_.kind;
  if (!state_.restored && resumed)
    spdlog::info("averaging: the checkpoint holds no averaged weights; the average starts from its weights");
  if (other_kind)
    spdlog::warn("averaging: the checkpoint's average is an {} one, this run's averaging.kind is '{}', which cannot "
                 "continue it; the average starts again from the checkpoint's weights",
                 state_.restored_kind, state_.kind);
  if (!state_.restored || other_kind) restart_from_model();
}

void WeightAveraging::after_step(int64_t global_step) {
  if (config_.kind != AveragingKind::ema) return;
  at::NoGradGuard no_grad;
  if (global_step <= config_.start_step) {
    // Not started: the average is the weights.
    for (size_t i = 0; i < live_.size(); ++i) state_.tensors[i].second.copy_(live_[i]);
  } else {
    // average += (1 - decay) * (weights - average): decay * average + (1 - decay) * weights.
    const double weight = 1.0 - config_.decay;
    for (size_t i = 0; i < live_.size(); ++i) state_.tensors[i].second.lerp_(live_[i], weight);
    ++state_.count;
  }
}

void WeightAveraging::after_epoch(int64_t epoch) {
  if (config_.kind != AveragingKind::swa || epoch < swa_start_) return;
  at::NoGradGuard no_grad;
  ++state_.count;
  // The running mean of the epoch ends so far (AveragedModel's default).
  const double weight = 1.0 / static_cast<double>(state_.count);
  for (size_t i = 0; i < live_.size(); ++i) state_.tensors[i].second.lerp_(live_[i], weight);
}

std::string WeightAveraging::never_updated(int64_t last_epoch, int64_t global_step) const {
  if (state_.count > 0) return "";
  if (config_.kind == AveragingKind::swa)
    return fmt::format("SWA averaged no epoch's end (it starts at epoch {}, the fit ended in epoch {})", swa_start_,
                       last_epoch);
  return fmt::format("the EMA was never updated (it starts after step {}, the fit ended at step {})",
                     config_.start_step, global_step);
}

bool WeightAveraging::ready() const { return config_.kind == AveragingKind::ema || state_.count > 0; }

void WeightAveraging::swap_in() {
  at::NoGradGuard no_grad;
  if (backup_.empty())
    for (const at::Tensor& t : live_) backup_.push_back(at::empty_like(t));
  for (size_t i = 0; i < live_.size(); ++i) {
    backup_[i].copy_(live_[i]);
    live_[i].copy_(state_.tensors[i].second);
  }
}

void WeightAveraging::swap_out() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) live_[i].copy_(backup_[i]);
}

void WeightAveraging::copy_into_model() {
  if (!ready()) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) live_[i].copy_(state_.tensors[i].second);
  backup_.clear();
}

WeightAveraging::InModel::InModel(WeightAveraging* averaging)
    : averaging_(averaging && averaging->ready() ? averaging : nullptr) {
  if (averaging_) averaging_->swap_in();
}

WeightAveraging::InModel::~InModel() {
  if (averaging_) averaging_->swap_out();
}

}  // namespace kiln
