#include <stdexcept>

#include <ATen/ATen.h>

#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/tensor_sections.hpp"
#include "config/options.hpp"
#include "distributed/process_group.hpp"
#include "optim/optimizer_checkpoint.hpp"

namespace kiln {

namespace {

// One parameter's owned elements of a whole state's fields.
class OwnedFields : public ParamStateReader {
 public:
  OwnedFields(const ParamStateFields& whole, ShardLayout::Run run) : whole_(whole), run_(run) {}
  bool has(const std::string& field) const override {
    for (const auto& [name, t] : whole_.tensors)
      if (name == field) return true;
    for (const auto& [name, text] : whole_.texts)
      if (name == field) return true;
    return false;
  }
  at::Tensor tensor(const std::string& field) const override {
    for (const auto& [name, t] : whole_.tensors)
      if (name == field) return t.reshape({-1}).narrow(0, run_.begin, run_.length).clone();
    throw std::logic_error("optimizer state field '" + field + "' is not a tensor");
  }
  int64_t count(const std::string& field) const override {
    for (const auto& [name, text] : whole_.texts)
      if (name == field) return std::stoll(text);
    throw std::logic_error("optimizer state field '" + field + "' is not a count");
  }

 private:
  const ParamStateFields& whole_;
  ShardLayout::Run run_;
};

}  // namespace

void ShardedOptimizerPart::gather() {
  const OptimizerEntry& entry = entry_of(optimizer_);
  auto& states = optimizer_.state();
  std::vector<std::optional<ParamStateFields>> own(owned_.size());
  std::vector<std::string> names;  // the tensor fields, as the first state with any names them
  for (size_t i = 0; i < owned_.size(); ++i) {
    auto it = states.find(optimizer_state_key(owned_[i]));
    if (it == states.end()) continue;  // no step taken for this parameter (the same on every rank)
    own[i] = entry.save_state(*it->second);
    if (names.empty())
      for (const auto& [name, t] : own[i]->tensors) names.push_back(name);
  }
  // Only rank 0 writes the checkpoint: the others send and keep nothing.
  const bool keep = layout_.rank() == 0;
  gathered_.assign(owned_.size(), std::nullopt);
  for (size_t i = 0; i < owned_.size(); ++i)
    if (own[i] && keep) gathered_[i] = ParamStateFields{{}, own[i]->texts};
  for (const std::string& name : names) {
    // One all-gather a field: every parameter's owned elements at their
    // place in this rank's part of the flat space.
    at::Tensor part = at::zeros({layout_.shard_size()}, trainable_[0].options().requires_grad(false));
    for (size_t i = 0; i < owned_.size(); ++i) {
      if (!own[i] || owned_[i].numel() == 0) continue;
      for (const auto& [field, t] : own[i]->tensors)
        if (field == name) part.narrow(0, layout_.position_in_shard(i), owned_[i].numel()).copy_(t.reshape({-1}));
    }
    at::Tensor whole = part;
    if (group_ && layout_.world_size() > 1) {
      whole = at::empty({layout_.padded()}, part.options());
      group_->all_gather(part, whole, "its part of the optimizer's state for a checkpoint");
    }
    for (size_t i = 0; i < owned_.size(); ++i)
      if (gathered_[i])
        gathered_[i]->tensors.emplace_back(
            name, whole.narrow(0, layout_.offset(i), layout_.numel(i)).view(trainable_[i].sizes()).clone());
  }
}

void ShardedOptimizerPart::save(CheckpointSnapshot& snapshot) const {
  for (size_t i = 0; i < gathered_.size(); ++i) {
    if (!gathered_[i]) continue;
    const std::string prefix = "optim/" + std::to_string(i) + "/";
    for (const auto& [name, text] : gathered_[i]->texts) snapshot.add(prefix + name, text);
    for (const auto& [name, tensor] : gathered_[i]->tensors) add_tensor_section(snapshot, prefix + name, tensor);
    gathered_[i].reset();  // copied: not held until the next commit
  }
  groups_part_.save(snapshot);
}

void ShardedOptimizerPart::load(const CheckpointFile& file) {
  const OptimizerEntry& entry = entry_of(optimizer_);
  auto& states = optimizer_.state();
  states.clear();
  for (size_t i = 0; i < owned_.size(); ++i) {
    const ParamStateSections sections(file, i, trainable_[i]);
    if (!sections.has(entry.state_marker)) {
      for (const auto& other : optimizer_registry())
        if (sections.has(other.state_marker))
          throw CheckpointError(file.path().string() + ": the checkpoint holds " + other.state_name +
                                " state, but the optimizer is " + option_name(entry.name) +
                                " (optimizer.name differs from the checkpointed run's)");
      continue;
    }
    // The whole state as a replicated run loads it, then this rank's elements.
    const ParamStateFields whole = entry.save_state(*entry.load_state(sections));
    states[optimizer_state_key(owned_[i])] = entry.load_state(OwnedFields(whole, layout_.owned(i)));
  }
}

}  // namespace kiln
