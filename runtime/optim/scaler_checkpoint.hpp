// 16-mixed's gradient scaler in a checkpoint: section "amp/scaler",
// "scale <g>\ngrowth_tracker <n>\nskipped <n>\n" (ckpt/section_fields).
// No LibTorch here.
#pragma once

#include <string>

#include "ckpt/stateful.hpp"
#include "optim/scaler_state.hpp"

namespace kiln {

// The section's text, and its state (CheckpointError "<file>: section
// 'amp/scaler' is not a gradient scaler's state (<text>)" when it is not one).
std::string scaler_text(const ScalerState& state);
ScalerState read_scaler(const CheckpointFile& file);

// A checkpoint without the section restores nothing (the scaler starts afresh).
class ScalerPart : public Stateful {
 public:
  explicit ScalerPart(ScalerState& state) : state_(state) {}
  void save(CheckpointSnapshot& snapshot) const override { snapshot.add("amp/scaler", scaler_text(state_)); }
  void load(const CheckpointFile& file) override {
    if (file.has("amp/scaler")) state_ = read_scaler(file);
  }

 private:
  ScalerState& state_;
};

}  // namespace kiln
