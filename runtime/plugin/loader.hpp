// Loads plugin shared objects and checks them against the ABI before any
// plugin code runs. Every refusal is an InputError (exit 2) with one line
// naming the file, the manifest slot and what to do.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/abi.h"

namespace kiln {

class PluginLibrary;  // one loaded shared object (loader.cpp)

// A validated descriptor, and the library that keeps it alive.
struct LoadedPlugin {
  std::shared_ptr<PluginLibrary> library;
  const kiln_descriptor* descriptor = nullptr;
  std::filesystem::path path;
  std::string slot;  // "model", "data", "callbacks[0]"; "" when inspecting
  uint32_t abi_minor = 0;  // of KILN_ABI_VERSION_MAJOR, as the plugin was built

  const char* id() const { return descriptor->id; }
  const kiln_lifecycle& lifecycle() const { return *descriptor->lifecycle; }
  const kiln_model_hooks& model_hooks() const {
    return *static_cast<const kiln_model_hooks*>(descriptor->hooks);
  }
  const kiln_data_hooks& data_hooks() const {
    return *static_cast<const kiln_data_hooks*>(descriptor->hooks);
  }
  const kiln_callback_hooks& callback_hooks() const {
    return *static_cast<const kiln_callback_hooks*>(descriptor->hooks);
  }
  // ABI 1.2's hooks, NULL when the plugin's table predates them.
  decltype(kiln_model_hooks::on_epoch_end) model_on_epoch_end() const {
    const auto* h = static_cast<const kiln_model_hooks*>(descriptor->hooks);
    return KILN_HAS_FIELD(h, kiln_model_hooks, on_epoch_end) ? h->on_epoch_end : nullptr;
  }
  // ABI 1.5's, NULL likewise.
  decltype(kiln_model_hooks::check_batch) model_check_batch() const {
    const auto* h = static_cast<const kiln_model_hooks*>(descriptor->hooks);
    return KILN_HAS_FIELD(h, kiln_model_hooks, check_batch) ? h->check_batch : nullptr;
  }
  decltype(kiln_callback_hooks::on_epoch_collected) callback_on_epoch_collected() const {
    const auto* h = static_cast<const kiln_callback_hooks*>(descriptor->hooks);
    return KILN_HAS_FIELD(h, kiln_callback_hooks, on_epoch_collected) ? h->on_epoch_collected : nullptr;
  }
};

// What `kiln inspect` shows of one descriptor.
struct PluginReport {
  std::string id, name, version, description, kind, torch_version;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<std::string> hooks;  // implemented (non-NULL) hooks
  uint64_t flags = 0;
};

const char* kind_name(kiln_plugin_kind kind);

// The LibTorch major.minor this host was built against, e.g. "1.13".
std::string host_torch_version();

class Loader {
 public:
  Loader();
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Loads `path` (once per file) and returns the descriptor for `slot`:
  // the one whose id is `id`, or the only one when `id` is empty. `context`
  // names where the request came from (e.g. "run.toml [model]").
  LoadedPlugin load(const std::filesystem::path& path, const std::string& id,
                    kiln_plugin_kind expected_kind, const std::string& slot,
                    const std::string& context);

  // Every descriptor of a shared object, for `kiln inspect`.
  std::vector<PluginReport> inspect(const std::filesystem::path& path);

 private:
  std::shared_ptr<PluginLibrary> open(const std::filesystem::path& path, const std::string& context);
  std::map<std::filesystem::path, std::shared_ptr<PluginLibrary>> libraries_;
};

// Refuses two plugins with one id in a run (their log lines, metrics and
// checkpoint state would be indistinguishable).
void check_unique_ids(const std::vector<const LoadedPlugin*>& plugins, const std::string& manifest);

PluginReport describe_plugin(const kiln_descriptor& descriptor, const kiln_entry& entry);

}  // namespace kiln
