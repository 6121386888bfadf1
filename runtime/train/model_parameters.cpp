#include "train/model_parameters.hpp"

#include "ckpt/run_state.hpp"
#include "plugin/plugin_instance.hpp"
#include "plugin/proxies.hpp"
#include "plugin/inspect_services.hpp"
#include "util/errors.hpp"

namespace kiln {

std::vector<ParameterInfo> parameter_infos(const NamedTensors& params) {
  std::vector<ParameterInfo> out;
  out.reserve(params.size());
  for (const auto& [name, tensor] : params)
    out.push_back({name, tensor.numel(), static_cast<int64_t>(tensor.numel() * tensor.element_size()),
                   tensor.requires_grad()});
  return out;
}

std::vector<ParameterInfo> inspect_model_parameters(const LoadedPlugin& model, const std::string& config_toml) {
  InspectServices services;
  PluginInstance instance(model, config_toml, &services);
  try {
    instance.create();
    instance.setup(KILN_STAGE_FIT);
  } catch (const HookError& e) {
    // A refused configuration is the manifest's fault, as in `kiln fit`.
    if (e.code() == KILN_ERROR_INVALID_ARGUMENT) throw InputError(e.what());
    throw;
  }
  std::vector<ParameterInfo> out;
  try {
    out = parameter_infos(ModelProxy(instance, nullptr).parameters().params);
  } catch (...) {
    instance.teardown(KILN_STAGE_FIT, true);
    throw;
  }
  instance.teardown(KILN_STAGE_FIT, false);
  return out;
}

}  // namespace kiln
