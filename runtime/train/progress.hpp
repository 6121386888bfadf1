// What a person watching the run sees: a progress bar on a terminal, plain
// periodic lines otherwise (CI logs, files), or nothing. Both show the time
// spent and an estimate of the time left, for the epoch and, in a fit, for
// the whole fit ("[01:12<03:30] fit [1:02:11<2:40:00]", as Lightning's bar
// writes "elapsed<remaining"): the rates are this process's own, measured
// since its epoch began and since its first training epoch began.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "config/options.hpp"

namespace kiln {

// Seconds as a clock reads: "MM:SS" under an hour, else "H:MM:SS"; "?" when
// not known (negative, not finite).
std::string clock_text(double seconds);

// A fit's place, for the fit's estimate: the epoch about to run and the
// last one (max_epochs - 1; < 0: no epoch limit, no fit estimate).
struct ProgressFitPlace {
  int64_t epoch = -1;
  int64_t last_epoch = -1;
};

class Progress {
 public:
  enum class Mode { bar, lines, none };
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // automatic picks bar on a TTY and lines elsewhere.
  static Mode mode_from(ProgressMode setting);

  // `clock`: the time source (tests give their own).
  Progress(Mode mode, int64_t log_every_n_steps, Clock clock = &std::chrono::steady_clock::now);
  using FitPlace = ProgressFitPlace;
  void begin(const std::string& label, int64_t total_batches, FitPlace fit = ProgressFitPlace());
  // `loss` reads the step's loss; it is called only when a line or the bar
  // is drawn (every log_every_n_steps, or 10 times a second), so the step
  // itself never waits to read it back. Empty: none to show (evaluation).
  void step(int64_t batch_index, const std::function<double()>& loss = {});
  void end();
  // What the last line or redraw said of the times ("[00:12<00:48] fit [...]").
  const std::string& last_times() const { return last_times_; }

 private:
  std::string times(std::chrono::steady_clock::time_point now, int64_t done);
  Mode mode_;
  int64_t every_;
  Clock clock_;
  std::string label_;
  int64_t total_ = 0;
  int64_t first_ = -1;  // the first batch index this epoch stepped (a resumed epoch starts past 0)
  FitPlace fit_;
  std::chrono::steady_clock::time_point start_, last_draw_, fit_start_;
  bool fit_started_ = false;
  int64_t fit_batches_ = 0;  // batches stepped in earlier epochs of this fit, by this process
  int64_t done_in_epoch_ = 0;
  bool drawn_ = false;
  std::string last_times_;
};

}  // namespace kiln
