#include "optim/optimizer_checkpoint.hpp"

#include <stdexcept>

#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/tensor_sections.hpp"
#include "config/options.hpp"
#include "optim/optim_registry.hpp"
#include "optim/param_groups.hpp"

namespace kiln {

const OptimizerEntry& entry_of(const torch::optim::Optimizer& optimizer) {
  const OptimizerEntry* entry = optimizer_entry_of(optimizer);
  if (!entry) throw std::logic_error("checkpoint: the optimizer was not built by kiln's optimizer registry");
  return *entry;
}

bool ParamStateSections::has(const std::string& field) const { return file_.has(prefix_ + field); }

at::Tensor ParamStateSections::tensor(const std::string& field) const {
  at::Tensor t = at::empty_like(param_);
  restore_tensor_section(file_, prefix_ + field, prefix_ + field, t);
  return t;
}

int64_t ParamStateSections::count(const std::string& field) const {
  return parse_count(file_, "section '" + prefix_ + field + "'", file_.section(prefix_ + field));
}

void OptimizerPart::save(CheckpointSnapshot& snapshot) const {
  if (trainable_) {
    const OptimizerEntry& entry = entry_of(optimizer_);
    auto& states = optimizer_.state();
    for (size_t i = 0; i < trainable_->size(); ++i) {
      auto it = states.find(optimizer_state_key((*trainable_)[i]));
      if (it == states.end()) continue;  // no step taken yet for this parameter
      const std::string prefix = "optim/" + std::to_string(i) + "/";
      const ParamStateFields fields = entry.save_state(*it->second);
      for (const auto& [name, text] : fields.texts) snapshot.add(prefix + name, text);
      for (const auto& [name, tensor] : fields.tensors) add_tensor_section(snapshot, prefix + name, tensor);
    }
  }
  if (!groups_.empty()) snapshot.add("optim/groups", groups_);
}

// The same optimization, or none of it: groups, their parameters and
// options as the checkpointed run had them (checkpoints from before
// parameter groups had one group and no "optim/groups").
void OptimizerPart::check(const CheckpointFile& file) const {
  if (groups_.empty()) return;
  const std::string where = file.path().string();
  if (file.has("optim/groups")) {
    if (auto difference = param_groups_difference(std::string(file.section("optim/groups")), groups_))
      throw CheckpointError(where + ": the optimizer differs from the checkpointed run's: " + *difference +
                            " (resume with the optimizer settings the run was started with)");
  } else if (groups_.find("group optimizer.groups[") != std::string::npos) {
    throw CheckpointError(where + ": the checkpoint has no [[optimizer.groups]] (it was written before kiln had "
                                  "parameter groups) but the manifest has some (resume without them)");
  }
}

void OptimizerPart::load(const CheckpointFile& file) {
  if (!trainable_) return;
  const OptimizerEntry& entry = entry_of(optimizer_);
  auto& states = optimizer_.state();
  states.clear();
  for (size_t i = 0; i < trainable_->size(); ++i) {
    const ParamStateSections fields(file, i, (*trainable_)[i]);
    if (fields.has(entry.state_marker)) {
      states[optimizer_state_key((*trainable_)[i])] = entry.load_state(fields);
      continue;
    }
    for (const auto& other : optimizer_registry()) {
      if (fields.has(other.state_marker))
        throw CheckpointError(file.path().string() + ": the checkpoint holds " + other.state_name +
                              " state, but the optimizer is " + option_name(entry.name) +
                              " (optimizer.name differs from the checkpointed run's)");
    }
  }
}

}  // namespace kiln
