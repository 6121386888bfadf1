// The model's tensors as the run holds them (TrainingState): collected from
// the plugin once it is set up, placed on the run's device in place, so
// that the plugin's module sees the same tensors the optimizer steps.
#pragma once

#include <c10/core/Device.h>

#include "train/command.hpp"
#include "train/run/run_checkpoints.hpp"

namespace kiln {

class ModelProxy;

// Fills `state`'s params, buffers and trainable lists from `model`. Throws
// HookError for a fit of a model without parameters. `bf16`
// (trainer.precision = "bf16-true"): every floating-point parameter and
// buffer, frozen ones too, becomes bfloat16 in place, as Lightning's
// module.to(torch.bfloat16). `sharded`: the parameters will be sharded
// (distributed.shard = "parameters"), so nothing here reads their values
// (a plugin may leave them unread until then: kiln_exported maps them).
void collect_model_state(ModelProxy& model, c10::Device device, Command command, TrainingState& state,
                         bool bf16 = false, bool sharded = false);

}  // namespace kiln
