// The model's parameters as the summary table takes them, in a run and
// without one: `kiln inspect run.toml` creates the model plugin from the
// manifest, sets it up for fit, reads what it reports and tears it down —
// no data module, no run directory, nothing written.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "plugin/loader.hpp"
#include "train/model_summary.hpp"

namespace at {
class Tensor;
}

namespace kiln {

// From named tensors (common/named_tensors.hpp), without LibTorch here.
std::vector<ParameterInfo> parameter_infos(const std::vector<std::pair<std::string, at::Tensor>>& params);

// Throws HookError (the plugin's own message) when the model refuses.
std::vector<ParameterInfo> inspect_model_parameters(const LoadedPlugin& model, const std::string& config_toml);

}  // namespace kiln
