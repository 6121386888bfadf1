// The loops' events on their way to the callbacks: the training monitors
// (learning rates, throughput, step time; rank 0 of a fit) see them first,
// and their step rows go to the loggers. The epoch's monitor values wait
// here for the epoch's row.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "loop_parts/loop_parts.hpp"
#include "train/monitors.hpp"

namespace torch::optim {
class Optimizer;
}

namespace kiln {

class Loggers;

class EventFanOut final : public EventSink {
 public:
  explicit EventFanOut(Loggers& loggers) : loggers_(loggers) {}

  // The callbacks, once the plugins are created.
  void set_callbacks(EventSink* callbacks) { callbacks_ = callbacks; }
  // fit, rank 0: the monitors over `optimizer`'s parameter groups.
  TrainingMonitors& start_monitors(int64_t log_every_n_steps, int32_t world_size,
                                   const torch::optim::Optimizer& optimizer);

  void notify(Event event, const kiln_progress& progress) override;

  // The last training epoch's monitor values (once: taken by its row).
  std::map<std::string, double> take_epoch_monitors();

 private:
  Loggers& loggers_;
  EventSink* callbacks_ = nullptr;
  std::optional<TrainingMonitors> monitors_;
  std::map<std::string, double> epoch_monitors_;
};

}  // namespace kiln
