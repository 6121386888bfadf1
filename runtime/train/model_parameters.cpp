#include "train/model_parameters.hpp"

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
  return inspect_plugin(model, config_toml, [](PluginInstance& instance, InspectServices&) {
    return parameter_infos(ModelProxy(instance, nullptr).parameters().params);
  });
}

}  // namespace kiln
