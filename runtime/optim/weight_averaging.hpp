// [averaging]: averaged weights kept beside the trained ones, by the host
// (plugins are unchanged) — an exponential moving average updated after each
// optimizer step (timm's ModelEmaV2, Lightning's EMAWeightAveraging), or
// stochastic weight averaging over epoch ends (torch.optim.swa_utils, with
// SWALR's learning rate in optim/optim.hpp's LrSchedule).
//
// The average lives on the model's device and is updated in place, without
// reading anything back. Floating-point parameters and buffers are averaged
// (AveragedModel's use_buffers=True); other buffers (counters) stay the
// model's. Validation, test and predict see the average (it is swapped into
// the model's tensors and back), and at the fit's end it becomes the model's
// weights, as Lightning does; checkpoints carry it ("average/..."), and
// `kiln export` writes it. The weights are the same on every rank, so is
// the average.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/averaged_checkpoint.hpp"
#include "common/named_tensors.hpp"
#include "config/manifest.hpp"

namespace kiln {

class WeightAveraging {
 public:
  // `params`, `buffers`: the live model's tensors, on the run's device.
  // The average starts as a copy of them.
  WeightAveraging(const AveragingConfig& config, int64_t max_epochs, const NamedTensors& params,
                  const NamedTensors& buffers);

  AveragingKind kind() const { return config_.kind; }
  // What a checkpoint saves and restores (optim/averaged_checkpoint.hpp).
  AveragedState& state() { return state_; }
  // Its part of a checkpoint ("average/…"), to register with the checkpointer.
  Stateful& checkpoint_part() { return part_; }
  // A checkpoint without an average was restored into the model: the
  // average starts again from the restored weights.
  void restart_from_model();
  // Before the fit's first step, after any restore: continues the restored
  // average, or starts again from the model's weights when there is none or
  // it is of the other kind (an EMA is no mean of epoch ends), saying so.
  void begin_fit(bool resumed);

  // EMA: after optimizer step `global_step` (counted from 1).
  void after_step(int64_t global_step);
  // SWA: after training epoch `epoch` (0-based) ran to its end.
  void after_epoch(int64_t epoch);

  // Whether the average differs from the weights yet (SWA before its first
  // epoch has none).
  bool ready() const;
  // Why the average holds no update when the fit ended in epoch `last_epoch`
  // at `global_step` (an SWA before its first epoch's end, an EMA before
  // its start step); "" once it holds one. The model then keeps its trained
  // weights, and the run says so rather than let them pass for averaged.
  std::string never_updated(int64_t last_epoch, int64_t global_step) const;
  // The average in the model's tensors for the guard's life (validation,
  // test, predict); the trained weights come back after.
  class InModel {
   public:
    explicit InModel(WeightAveraging* averaging);
    ~InModel();
    InModel(const InModel&) = delete;
    InModel& operator=(const InModel&) = delete;

   private:
    WeightAveraging* averaging_;
  };
  // The average becomes the model's weights for good (the fit's end, or an
  // evaluation of a checkpoint).
  void copy_into_model();

 private:
  void swap_in();
  void swap_out();

  AveragingConfig config_;
  int64_t swa_start_;
  std::vector<at::Tensor> live_;    // the model's tensors the average follows, in state_.tensors' order
  std::vector<at::Tensor> backup_;  // the trained weights while the average is in the model
  AveragedState state_;
  AveragedPart part_{state_};
};

}  // namespace kiln
