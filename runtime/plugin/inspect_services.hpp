// What a plugin may ask of the host while `kiln inspect` only looks at it
// (and inspect_plugin, how it looks):
// one process, no metrics kept, nothing to stop, and the files it would
// write into the run directory kept here (to be shown), never written.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "plugin/plugin_instance.hpp"
#include "plugin/run_services.hpp"
#include "util/errors.hpp"

namespace kiln {

class InspectServices final : public RunServices {
 public:
  void record_metric(const std::string&, const char*, double, double, uint32_t) override {}
  void record_metric_tensor(const std::string&, const char*, const at::Tensor&, double, uint32_t) override {}
  bool metric(const char*, double*) const override { return false; }
  void request_stop(const std::string&, const char*) override {}
  int32_t rank() const override { return 0; }
  int32_t world_size() const override { return 1; }
  std::string write_run_file(const std::string& plugin_id, const std::string& name, std::string bytes) override {
    files[plugin_id + "/" + name] = std::move(bytes);
    return "";
  }
  std::map<std::string, std::string> files;  // "<plugin id>/<name>" -> bytes
};

// Creates `plugin` with these services, sets it up for fit, returns what
// `look(instance, services)` returns, and tears it down (failed when `look`
// threw). A refused configuration is the manifest's fault, an InputError
// (exit 2), as in `kiln fit`.
template <class Look>
auto inspect_plugin(const LoadedPlugin& plugin, const std::string& config_toml, Look look) {
  InspectServices services;
  PluginInstance instance(plugin, config_toml, &services);
  try {
    instance.create();
    instance.setup(KILN_STAGE_FIT);
  } catch (const HookError& e) {
    if (e.code() == KILN_ERROR_INVALID_ARGUMENT) throw InputError(e.what());
    throw;
  }
  decltype(look(instance, services)) out;
  try {
    out = look(instance, services);
  } catch (...) {
    instance.teardown(KILN_STAGE_FIT, true);
    throw;
  }
  instance.teardown(KILN_STAGE_FIT, false);
  return out;
}

}  // namespace kiln
