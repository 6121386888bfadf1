// Monitors: values about the training itself, logged as metrics like any
// other (so every logger gets them; docs/logging.md lists the names):
//   lr-<Optimizer>            each parameter group's learning rate (Lightning's
//   lr-<Optimizer>/pg<i>      LearningRateMonitor names; pg1, pg2, ... with
//                             several groups), the rate the step used
//   train/samples_per_sec     training samples per second, all ranks together
//   train/step_time           seconds per optimizer step (wall clock)
// An epoch row carries them over the epoch's steps; a step row (every
// trainer.log_every_n_steps steps) over the steps since the previous one,
// each name with Lightning's `_step` suffix, beside train/loss_step.
//
// Issue 9's rule holds: nothing here reads the device back per step. Time is
// the host's clock; a learning rate is a host value; the loss is read back
// only when a step row is made (a log point).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace kiln {

// "SGD", "Adam", "AdamW", ...: the torch::optim class, as Lightning names it.
std::string optimizer_class_name(const torch::optim::Optimizer& optimizer);
// The monitor name of group `index` of `groups`: lr-SGD, or lr-SGD/pg2.
std::string learning_rate_name(const std::string& optimizer_class, size_t index, size_t groups);

class TrainingMonitors {
 public:
  using Clock = std::chrono::steady_clock;
  TrainingMonitors(int64_t log_every_n_steps, int32_t world_size);

  // The optimizer whose parameter groups are read (param_groups(): one
  // group or several).
  void attach(const torch::optim::Optimizer& optimizer);
  // Each training batch: its loss (kept, not read) and its rows on this rank.
  void on_batch(const at::Tensor& loss, int64_t rows);
  void on_epoch_start(Clock::time_point now = Clock::now());
  // After each optimizer step: a step row's metrics every
  // log_every_n_steps-th global step, nothing otherwise.
  std::optional<std::map<std::string, double>> on_step_end(int64_t global_step, Clock::time_point now = Clock::now());
  // Validation inside an epoch (trainer.val_check_interval): its time is
  // left out of the step timings.
  void on_validation_start(Clock::time_point now = Clock::now());
  void on_validation_end(Clock::time_point now = Clock::now());
  // At the epoch's end: its values (the rates and timings over its steps).
  std::map<std::string, double> epoch_values() const;

 private:
  void read_learning_rates(std::vector<double>& rates) const;
  void add_rates(std::map<std::string, double>& row, const std::vector<double>& rates, const char* suffix) const;

  int64_t every_;
  int32_t world_size_;
  const torch::optim::Optimizer* optimizer_ = nullptr;
  std::string optimizer_class_;
  at::Tensor last_loss_;
  int64_t batch_samples_ = 0;      // since the last step end
  std::vector<double> rates_next_;  // what the next step will use
  std::vector<double> rates_used_;  // what the last step used
  Clock::time_point epoch_start_, window_start_, last_step_end_, validation_start_;
  int64_t epoch_steps_ = 0, epoch_samples_ = 0;
  int64_t window_steps_ = 0, window_samples_ = 0;
};

}  // namespace kiln
