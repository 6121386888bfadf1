#include "train/monitors.hpp"

#include <torch/optim.h>

namespace kiln {

std::string optimizer_class_name(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  if (dynamic_cast<const AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<const Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const SGD*>(&optimizer)) return "SGD";
  if (dynamic_cast<const RMSprop*>(&optimizer)) return "RMSprop";
  if (dynamic_cast<const Adagrad*>(&optimizer)) return "Adagrad";
  if (dynamic_cast<const LBFGS*>(&optimizer)) return "LBFGS";
  return "Optimizer";
}

std::string learning_rate_name(const std::string& optimizer_class, size_t index, size_t groups) {
  std::string name = "lr-" + optimizer_class;
  if (groups > 1) name += "/pg" + std::to_string(index + 1);  // Lightning counts groups from 1
  return name;
}

TrainingMonitors::TrainingMonitors(int64_t log_every_n_steps, int32_t world_size)
    : every_(log_every_n_steps > 0 ? log_every_n_steps : 1), world_size_(world_size > 0 ? world_size : 1) {
  on_epoch_start();
}

void TrainingMonitors::attach(const torch::optim::Optimizer& optimizer) {
  optimizer_ = &optimizer;
  optimizer_class_ = optimizer_class_name(optimizer);
  read_learning_rates(rates_next_);
  rates_used_ = rates_next_;
}

// Into a vector kept between steps: no allocation per step.
void TrainingMonitors::read_learning_rates(std::vector<double>& rates) const {
  rates.clear();
  if (!optimizer_) return;
  for (const auto& group : optimizer_->param_groups()) rates.push_back(group.options().get_lr());
}

void TrainingMonitors::add_rates(std::map<std::string, double>& row, const std::vector<double>& rates,
                                 const char* suffix) const {
  for (size_t i = 0; i < rates.size(); ++i) row[learning_rate_name(optimizer_class_, i, rates.size()) + suffix] = rates[i];
}

void TrainingMonitors::on_batch(const at::Tensor& loss, int64_t rows) {
  // No read-back: a step row reads it, if one is due. The loop hands over a
  // loss it already detached; another detach would be a new tensor per step.
  last_loss_ = loss.requires_grad() ? loss.detach() : loss;
  batch_samples_ += rows * world_size_;
}

void TrainingMonitors::on_epoch_start(Clock::time_point now) {
  epoch_start_ = window_start_ = last_step_end_ = now;
  epoch_steps_ = epoch_samples_ = window_steps_ = window_samples_ = batch_samples_ = 0;
  // A per-epoch schedule has just set this epoch's rate.
  read_learning_rates(rates_next_);
}

std::optional<std::map<std::string, double>> TrainingMonitors::on_step_end(int64_t global_step, Clock::time_point now) {
  last_step_end_ = now;
  ++epoch_steps_;
  ++window_steps_;
  epoch_samples_ += batch_samples_;
  window_samples_ += batch_samples_;
  batch_samples_ = 0;
  // The rate this step used was read before it; a per-step schedule has
  // already set the next one.
  std::swap(rates_used_, rates_next_);
  read_learning_rates(rates_next_);
  if (global_step % every_ != 0) return std::nullopt;

  std::map<std::string, double> row;
  if (last_loss_.defined()) row["train/loss_step"] = last_loss_.item<double>();  // a log point: read back now
  add_rates(row, rates_used_, "_step");
  const double seconds = std::chrono::duration<double>(now - window_start_).count();
  if (seconds > 0) row["train/samples_per_sec_step"] = static_cast<double>(window_samples_) / seconds;
  row["train/step_time_step"] = seconds / static_cast<double>(window_steps_);
  window_start_ = now;
  window_steps_ = window_samples_ = 0;
  return row;
}

void TrainingMonitors::on_validation_start(Clock::time_point now) { validation_start_ = now; }

void TrainingMonitors::on_validation_end(Clock::time_point now) {
  // The clocks move on by the validation's time, so no span includes it.
  const auto paused = now - validation_start_;
  epoch_start_ += paused;
  window_start_ += paused;
  last_step_end_ += paused;
}

std::map<std::string, double> TrainingMonitors::epoch_values() const {
  std::map<std::string, double> row;
  // An epoch without steps (resumed at its very end) reports the rate in force.
  add_rates(row, epoch_steps_ > 0 ? rates_used_ : rates_next_, "");
  if (epoch_steps_ > 0) {
    const double seconds = std::chrono::duration<double>(last_step_end_ - epoch_start_).count();
    if (seconds > 0) row["train/samples_per_sec"] = static_cast<double>(epoch_samples_) / seconds;
    row["train/step_time"] = seconds / static_cast<double>(epoch_steps_);
  }
  return row;
}

}  // namespace kiln
