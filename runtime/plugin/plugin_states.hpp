// The plugin instances' part of a checkpoint: each instance's own state,
// as bytes by key, in sections "plugin/<id>/<key>" (plugin/proxies.hpp
// saves and loads an instance's). No LibTorch here.
#pragma once

#include <map>
#include <string>

#include "ckpt/stateful.hpp"

namespace kiln {

using PluginStates = std::map<std::string, std::map<std::string, std::string>>;  // plugin id -> key -> bytes

class PluginStatesPart : public Stateful {
 public:
  explicit PluginStatesPart(PluginStates& states) : states_(states) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void load(const CheckpointFile& file) override;

 private:
  PluginStates& states_;
};

}  // namespace kiln
