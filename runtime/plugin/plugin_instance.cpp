#include "plugin/plugin_instance.hpp"

#include "util/errors.hpp"

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

namespace kiln {

HookError::HookError(std::string plugin_id, std::string slot, std::string hook, std::string message,
                     kiln_error_code code)
    : std::runtime_error("plugin '" + plugin_id + "' [" + slot + "] failed in " + hook + ": " + message),
      plugin_id_(std::move(plugin_id)),
      slot_(std::move(slot)),
      hook_(std::move(hook)),
      message_(std::move(message)),
      code_(code) {}

PluginInstance::PluginInstance(LoadedPlugin plugin, std::string config_toml, RunServices* run)
    : plugin_(std::move(plugin)),
      id_(plugin_.id()),
      config_toml_(std::move(config_toml)),
      host_(std::make_shared<PluginHost>(id_, run, plugin_.descriptor->kind != KILN_KIND_DATA_MODULE)) {}

PluginInstance::~PluginInstance() { destroy(); }

void PluginInstance::check(kiln_error* error, const char* hook, const std::string& context) const {
  if (error == nullptr) return;
  kiln_error_code code = KILN_ERROR_UNKNOWN;
  const std::string full = take_error(error, &code);
  // One line: a multi-line message would break the report, and a LibTorch
  // error raised inside the plugin carries a C++ backtrace (kept for debug).
  if (full.find('\n') != std::string::npos) spdlog::debug("[{}] {}: {}", id_, hook, full);
  throw HookError(id_, plugin_.slot, hook, one_line(full) + context, code);
}

void PluginInstance::create() {
  kiln_instance* out = nullptr;
  check(plugin_.lifecycle().create(host_->table(), config_toml_.c_str(), &out), "create");
  if (out == nullptr) throw HookError(id_, plugin_.slot, "create", "create succeeded but returned no instance");
  instance_ = out;
}

void PluginInstance::setup(kiln_stage stage) {
  setup_entered_ = true;  // teardown is owed from here on, even if setup fails part-way
  if (auto fn = plugin_.lifecycle().setup) check(fn(instance_, stage), "setup");
}

void PluginInstance::teardown(kiln_stage stage, bool failed) {
  if (!setup_entered_ || torn_down_) return;
  torn_down_ = true;  // exactly once, whatever it returns
  if (auto fn = plugin_.lifecycle().teardown) check(fn(instance_, stage, failed ? 1 : 0), "teardown");
}

void PluginInstance::on_exception(const kiln_exception_info& info) {
  if (!created() || exception_told_) return;
  exception_told_ = true;
  if (auto fn = plugin_.lifecycle().on_exception) check(fn(instance_, &info), "on_exception");
}

void PluginInstance::destroy() noexcept {
  if (!created()) return;
  // A get_batch abandoned on a failure may still be running (teardown was
  // its chance to return): wait a little, then leave the instance to the
  // process's exit rather than free it under the call.
  for (int i = 0; i < 20 && calls_in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (calls_in_flight() > 0) {
    spdlog::warn("plugin '{}': a get_batch call is still running after teardown; destroy is skipped", id_);
    instance_ = nullptr;
    return;
  }
  kiln_instance* instance = instance_;
  instance_ = nullptr;
  plugin_.lifecycle().destroy(instance);
}

}  // namespace kiln
