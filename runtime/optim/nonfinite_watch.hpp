// trainer.detect_nonfinite: a NaN or inf training loss (or gradient norm,
// where clipping computes it) found without reading the device every step.
// Each step folds its loss into an accumulator on the loss's device
// (acc += 0 * loss: 0 while every loss is finite, NaN from the first that is
// not), or, for a loss in host memory, looks at its value where it lies; the
// accumulator is read back only at the loop's log points, every
// trainer.log_every_n_steps optimizer steps and at each epoch's end, where
// the loop reads back anyway. So a bad step is named by its window ("between
// step 3150 and 3200"), exactly when the window is one step.
//
// Every rank checks at the same steps and the ranks' findings are summed, so
// `raise` ends every rank at the same point with the same line. Before a
// checkpoint is committed the weights themselves are checked too: no
// checkpoint of non-finite weights is committed (raise: the run ends; warn:
// that checkpoint is skipped, with a line).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/options.hpp"

namespace kiln {

// What `raise` throws: one line for the person, exit 1.
class NonfiniteTraining : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class NonfiniteWatch {
 public:
  // `sum_over_ranks`: adds a small CPU double tensor over all ranks in place
  // (a collective; empty in a single process). `check_every`: optimizer
  // steps between log points.
  NonfiniteWatch(NonfiniteMode mode, int64_t check_every, std::function<void(at::Tensor&)> sum_over_ranks = {});

  bool on() const { return mode_ != NonfiniteMode::off; }
  // The window starts at `global_step` (a fit's start or resume).
  void start(int64_t global_step);

  // Per step, on the main thread: no read-back.
  void add_loss(const at::Tensor& loss);
  void add_grad_norm(const at::Tensor& norm);

  // Whether optimizer step `global_step` is a log point (every rank alike).
  bool due(int64_t global_step) const { return on() && global_step % check_every_ == 0; }
  // After optimizer step `global_step` (every rank): a log point when due.
  void after_step(int64_t global_step, int64_t epoch) {
    if (due(global_step)) check(global_step, epoch);
  }
  // A log point (every rank together): reads the window back; throws
  // NonfiniteTraining (raise) or logs one warning (warn) when it held a
  // non-finite value.
  void check(int64_t global_step, int64_t epoch);
  // Before committing a checkpoint at `global_step` (every rank): the window
  // and `weights`. Whether it may be committed (warn: false, with a line).
  bool may_commit(const std::vector<at::Tensor>& weights, int64_t global_step, int64_t epoch);

  // Reads of the device so far (the log points'; tests count them).
  int64_t reads() const { return reads_; }

 private:
  // {loss bad, gradient norm bad, weights bad} summed over ranks.
  std::vector<double> read_window(const std::vector<at::Tensor>* weights);
  std::string describe(const std::vector<double>& found, int64_t global_step, int64_t epoch) const;

  NonfiniteMode mode_;
  int64_t check_every_;
  std::function<void(at::Tensor&)> sum_over_ranks_;
  static bool host_value_bad(const at::Tensor& value, bool* bad);

  at::Tensor loss_acc_, grad_acc_;  // on the loss's device, float32 (a value off the host's memory)
  bool host_loss_bad_ = false, host_grad_bad_ = false;  // values read in host memory
  int64_t window_start_ = 0;
  bool warned_ = false;
  int64_t reads_ = 0;
};

}  // namespace kiln
