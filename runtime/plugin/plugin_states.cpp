#include "plugin/plugin_states.hpp"

namespace kiln {

void PluginStatesPart::save(CheckpointSnapshot& snapshot) const {
  for (const auto& [id, blobs] : states_)
    for (const auto& [key, bytes] : blobs) snapshot.add("plugin/" + id + "/" + key, bytes);
}

void PluginStatesPart::load(const CheckpointFile& file) {
  states_.clear();
  for (const auto& name : file.names()) {
    if (name.rfind("plugin/", 0) != 0) continue;
    const size_t slash = name.find('/', 7);
    if (slash == std::string::npos) continue;
    states_[name.substr(7, slash - 7)][name.substr(slash + 1)] = std::string(file.section(name));
  }
}

}  // namespace kiln
