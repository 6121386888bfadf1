// One created plugin: its instance, its host table, and which lifecycle
// hooks have run, so that cleanup calls each exactly once.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kiln/abi.h"
#include "plugin/host_services.hpp"
#include "plugin/loader.hpp"

namespace kiln {

// A hook that returned an error. `what()` is the one line the run reports.
class HookError : public std::runtime_error {
 public:
  HookError(std::string plugin_id, std::string slot, std::string hook, std::string message,
            kiln_error_code code = KILN_ERROR_UNKNOWN);
  kiln_error_code code() const { return code_; }
  const std::string& plugin_id() const { return plugin_id_; }
  const std::string& slot() const { return slot_; }
  const std::string& hook() const { return hook_; }
  const std::string& message() const { return message_; }

 private:
  std::string plugin_id_, slot_, hook_, message_;
  kiln_error_code code_;
};

class PluginInstance {
 public:
  PluginInstance(LoadedPlugin plugin, std::string config_toml, RunServices* run);
  ~PluginInstance();  // destroys the instance if still alive (never throws)
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  // Lifecycle. Each throws HookError when the plugin reports an error.
  void create();
  void setup(kiln_stage stage);
  void teardown(kiln_stage stage, bool failed);
  void on_exception(const kiln_exception_info& info);
  void destroy() noexcept;

  bool created() const { return instance_ != nullptr; }
  bool setup_entered() const { return setup_entered_; }
  bool torn_down() const { return torn_down_; }

  // Throws HookError for `hook` when `error` is non-NULL (taking the error).
  // `context` follows the plugin's message (which batch a get_batch built).
  void check(kiln_error* error, const char* hook, const std::string& context = "") const;

  // What a host thread calling into the plugin outside the main thread (a
  // prefetch thread) holds, so that abandoning it on a failure can never
  // unload the library or free the host table under its feet, and cleanup
  // can tell whether a call is still in progress.
  struct KeepAlive {
    std::shared_ptr<PluginLibrary> library;
    std::shared_ptr<PluginHost> host;
    std::shared_ptr<std::atomic<int>> in_flight;
    // Held around get_batch by every host thread that calls it (the prefetch
    // threads of every open stream, the main thread gathering inline) when
    // the data module does not set KILN_DATA_CONCURRENT_GET_BATCH: one call
    // at a time per instance, not per stream (a validation inside an epoch
    // opens a second stream while the first is still fetching).
    std::shared_ptr<std::mutex> serial;
    const kiln_descriptor* descriptor;
    kiln_instance* instance;
  };
  KeepAlive keep_alive() const {
    return {plugin_.library, host_, in_flight_, serial_, plugin_.descriptor, instance_};
  }
  // Calls made through keep_alive() that have not returned yet.
  int calls_in_flight() const { return in_flight_->load(); }

  const LoadedPlugin& plugin() const { return plugin_; }
  const std::string& id() const { return id_; }
  kiln_instance* instance() const { return instance_; }
  const kiln_host* host() const { return host_->table(); }

 private:
  LoadedPlugin plugin_;
  std::string id_;
  std::string config_toml_;
  std::shared_ptr<PluginHost> host_;
  std::shared_ptr<std::atomic<int>> in_flight_ = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::mutex> serial_ = std::make_shared<std::mutex>();
  kiln_instance* instance_ = nullptr;
  bool setup_entered_ = false;
  bool torn_down_ = false;
  bool exception_told_ = false;
};

}  // namespace kiln
