#include "train/run/start_agreement.hpp"

#include <stdexcept>

#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include "distributed/agreement.hpp"
#include "distributed/process_group.hpp"
#include "plugin/plugin_instance.hpp"

namespace kiln {

namespace {

std::string shape_text(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? "," : "") + std::to_string(t.size(d));
  return out + "]";
}

std::string plugin_builds(const std::vector<const PluginInstance*>& plugins) {
  std::string builds;
  for (const PluginInstance* p : plugins) {
    const char* version = p->plugin().descriptor->version;
    builds += p->plugin().slot + " " + p->id() + " " + (version ? version : "") + " " + file_digest(p->plugin().path) +
              "\n";
  }
  return builds;
}

}  // namespace

void agree_on_start(ProcessGroup& group, const StartFacts& facts, TrainingState& state) {
  Facts parts;
  parts.emplace_back("manifest", facts.manifest_text);
  parts.emplace_back("plugin builds", plugin_builds(facts.plugins));
  std::string shapes;
  for (auto* list : {&state.params, &state.buffers})
    for (auto& [name, t] : *list) shapes += name + " " + shape_text(t) + " " + std::string(c10::toString(t.scalar_type())) + "\n";
  parts.emplace_back("model parameters", shapes);
  parts.emplace_back("resume point", facts.resume_point.empty() ? "none (a fresh start)" : facts.resume_point);
  // The sampler shards each split by its length: ranks that see different
  // lengths (node-local data) would run different numbers of steps.
  parts.emplace_back("data split lengths", facts.split_lengths);

  if (auto difference = first_difference(group.all_gather_text(encode_facts(parts))))
    throw std::runtime_error(*difference);
  std::vector<at::Tensor> tensors;
  for (auto* list : {&state.params, &state.buffers})
    if (list != &state.params || !facts.parameters_sharded)
      for (auto& [name, t] : *list) tensors.push_back(t);
  {
    at::NoGradGuard no_grad;
    group.broadcast(tensors, 0);
  }
  spdlog::debug("start-up agreement: {} ranks agree; rank 0's weights broadcast", group.world_size());
}

}  // namespace kiln
