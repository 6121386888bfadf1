// What a person watching the run sees: a progress bar on a terminal, plain
// periodic lines otherwise (CI logs, files), or nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "config/options.hpp"

namespace kiln {

class Progress {
 public:
  enum class Mode { bar, lines, none };
  // automatic picks bar on a TTY and lines elsewhere.
  static Mode mode_from(ProgressMode setting);

  Progress(Mode mode, int64_t log_every_n_steps);
  void begin(const std::string& label, int64_t total_batches);
  // `loss` reads the step's loss; it is called only when a line or the bar
  // is drawn (every log_every_n_steps, or 10 times a second), so the step
  // itself never waits to read it back. Empty: none to show (evaluation).
  void step(int64_t batch_index, const std::function<double()>& loss = {});
  void end();

 private:
  Mode mode_;
  int64_t every_;
  std::string label_;
  int64_t total_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace kiln
