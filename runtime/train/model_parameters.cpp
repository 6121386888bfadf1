#include "train/model_parameters.hpp"

#include "ckpt/run_state.hpp"
#include "plugin/plugin_instance.hpp"
#include "plugin/proxies.hpp"
#include "plugin/run_services.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

// What a model may ask of the host while it is only being looked at: one
// process, no metrics kept, nothing to stop.
class InspectServices final : public RunServices {
 public:
  void record_metric(const std::string&, const char*, double, double, uint32_t) override {}
  void record_metric_tensor(const std::string&, const char*, const at::Tensor&, double, uint32_t) override {}
  bool metric(const char*, double*) const override { return false; }
  void request_stop(const std::string&, const char*) override {}
  int32_t rank() const override { return 0; }
  int32_t world_size() const override { return 1; }
};

}  // namespace

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
