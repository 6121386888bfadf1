#include "train/run/event_fan_out.hpp"

#include "metrics/loggers.hpp"

namespace kiln {

TrainingMonitors& EventFanOut::start_monitors(int64_t log_every_n_steps, int32_t world_size,
                                              const torch::optim::Optimizer& optimizer) {
  monitors_.emplace(log_every_n_steps, world_size);
  monitors_->attach(optimizer);
  return *monitors_;
}

void EventFanOut::notify(Event event, const kiln_progress& progress) {
  if (monitors_) {
    if (event == Event::train_epoch_start) monitors_->on_epoch_start();
    if (event == Event::train_batch_end) {
      if (auto metrics = monitors_->on_step_end(progress.global_step))
        loggers_.log(LogRow{LogRow::Kind::step, progress.epoch, progress.global_step, std::move(*metrics)});
    }
    if (event == Event::validation_start) monitors_->on_validation_start();
    if (event == Event::validation_end) monitors_->on_validation_end();
    if (event == Event::train_epoch_end) epoch_monitors_ = monitors_->epoch_values();
  }
  if (callbacks_) callbacks_->notify(event, progress);
}

std::map<std::string, double> EventFanOut::take_epoch_monitors() {
  std::map<std::string, double> out = std::move(epoch_monitors_);
  epoch_monitors_.clear();
  return out;
}

}  // namespace kiln
