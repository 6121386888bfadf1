// What `kiln fit` runs with, decided from the manifest before its first
// step: the loops' settings, the optimizer's parameter groups and the
// learning-rate schedule over the run's periods. Decisions only: the session
// (run_session.cpp) builds the optimizer and the loops from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "optim/param_groups.hpp"
#include "train/run/run_settings.hpp"

namespace kiln {

struct FitSettings;    // train/loops/fit_loop.hpp
class LrSchedule;      // optim/optim.hpp
struct TrainingState;  // train/run/run_checkpoints.hpp

// The fit loop's settings. `resuming`: a resumed run has no sanity
// validation.
FitSettings fit_settings(const Manifest& manifest, const RunSettings& run, bool resuming);

// [[optimizer.groups]] over the model's parameter names; the description
// goes into every checkpoint (a resumed run must have the same groups), as
// `state.optimizer_groups`.
std::vector<ParamGroup> plan_optimizer_groups(const Manifest& manifest, TrainingState& state,
                                              const std::string& model_id);

// The learning-rate schedule over the run's periods (steps or epochs), each
// group's from its base rate. `train_batches`: one epoch's, as the fit's
// training reads them.
LrSchedule lr_schedule(const Manifest& manifest, const RunSettings& run, const std::vector<ParamGroup>& groups,
                       int64_t train_batches);

}  // namespace kiln
