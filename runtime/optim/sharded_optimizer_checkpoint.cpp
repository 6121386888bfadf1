#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/tensor_sections.hpp"
#include "config/options.hpp"
#include "distributed/process_group.hpp"
#include "optim/optimizer_checkpoint.hpp"
#include "optim/sharded_step.hpp"

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

bool has_tensor(const ParamStateFields& fields, const std::string& name) {
  for (const auto& [field, t] : fields.tensors)
    if (field == name) return true;
  return false;
}

}  // namespace

std::optional<ParamStateFields> ShardedOptimizerPart::own_fields(size_t i) const {
  std::optional<ParamStateFields> out;
  auto& states = optimizer_.state();
  auto it = states.find(optimizer_state_key(owned_[i]));
  // No state: no step taken for this parameter (the same on every rank).
  if (it != states.end()) out = entry_of(optimizer_).save_state(*it->second);
  if (masters_) {  // every master, stepped yet or not (SGD without momentum keeps no state)
    if (!out) out.emplace();
    out->tensors.emplace_back(kMasterField, owned_[i]);
  }
  return out;
}

void ShardedOptimizerPart::gather() {
  if (rank_files_) return;  // each rank writes its own state
  std::vector<std::optional<ParamStateFields>> own(owned_.size());
  std::vector<std::string> names;  // every tensor field any parameter has, in the order met
  for (size_t i = 0; i < owned_.size(); ++i) {
    own[i] = own_fields(i);
    if (!own[i]) continue;
    for (const auto& [name, t] : own[i]->tensors)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  // Only rank 0 writes the checkpoint: the others send and keep nothing.
  const bool keep = layout_.rank() == 0;
  gathered_.assign(owned_.size(), std::nullopt);
  for (size_t i = 0; i < owned_.size(); ++i)
    if (own[i] && keep) gathered_[i] = ParamStateFields{{}, own[i]->texts};
  // The state's dtype is what the optimizer steps: the owned elements' (masters' or the weights').
  const at::TensorOptions options = trainable_[0].options().dtype(owned_[0].scalar_type()).requires_grad(false);
  const int64_t shard = layout_.shard_size(), world = layout_.world_size(), rank = layout_.rank();
  for (const std::string& name : names) {
    // This field of each parameter that has it: rank 0's whole tensors, filled below.
    std::vector<at::Tensor> whole(owned_.size());
    for (size_t i = 0; i < owned_.size(); ++i)
      if (gathered_[i] && has_tensor(*own[i], name)) whole[i] = at::zeros(trainable_[i].sizes(), options);
    // This rank's owned values of the field, one tensor a parameter (its run).
    std::vector<at::Tensor> mine(owned_.size());
    for (size_t i = 0; i < owned_.size(); ++i)
      if (own[i])
        for (const auto& [field, t] : own[i]->tensors)
          if (field == name) mine[i] = t.reshape({-1});
    // In chunks, as the weights are gathered (optim/sharded_step.cpp): what
    // the all-gather stages is bounded, whatever the model's size.
    for (int64_t at = 0; at < shard; at += kShardGatherChunk) {
      const int64_t length = std::min(kShardGatherChunk, shard - at);
      at::Tensor part = at::zeros({length}, options);
      const int64_t begin = rank * shard + at;
      for (size_t i = 0; i < owned_.size(); ++i) {
        if (!mine[i].defined() || mine[i].numel() == 0) continue;
        const int64_t run_at = layout_.offset(i) + layout_.owned(i).begin;  // its run's first flat index
        const int64_t lo = std::max(begin, run_at), hi = std::min(begin + length, run_at + mine[i].numel());
        if (hi > lo) part.narrow(0, lo - begin, hi - lo).copy_(mine[i].narrow(0, lo - run_at, hi - lo));
      }
      at::Tensor every = part;
      if (group_ && world > 1) {
        every = at::empty({world * length}, options);
        group_->all_gather(part, every, "its part of the optimizer's state for a checkpoint");
      }
      if (!keep) continue;
      for (int64_t r = 0; r < world; ++r)
        copy_flat(whole, layout_, r * shard + at, every.narrow(0, r * length, length), /*into_params=*/true);
    }
    for (size_t i = 0; i < owned_.size(); ++i)
      if (whole[i].defined()) gathered_[i]->tensors.emplace_back(name, whole[i]);
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

void ShardedOptimizerPart::OwnedStatePart::save(CheckpointSnapshot& snapshot) const {
  const ShardedOptimizerPart& w = whole_;
  for (size_t i = 0; i < w.owned_.size(); ++i) {
    if (w.owned_[i].numel() == 0) continue;
    const std::optional<ParamStateFields> own = w.own_fields(i);
    if (!own) continue;
    const std::string prefix = "optim/" + std::to_string(i) + "/";
    const ParamStateFields& fields = *own;
    for (const auto& [name, text] : fields.texts) snapshot.add(prefix + name, text);
    for (const auto& [name, tensor] : fields.tensors) add_tensor_section(snapshot, prefix + name, tensor.reshape({-1}));
  }
}

void ShardedOptimizerPart::load(const CheckpointFile& file) {
  const OptimizerEntry& entry = entry_of(optimizer_);
  auto& states = optimizer_.state();
  states.clear();
  const OptimizerStateSource source(file, trainable_, owned_.empty() ? at::kFloat : owned_[0].scalar_type());
  for (size_t i = 0; i < owned_.size(); ++i) {
    const std::unique_ptr<ParamStateReader> reader = source.reader(i);
    const ParamStateReader& sections = *reader;
    {
      at::NoGradGuard no_grad;
      const ShardLayout::Run run = layout_.owned(i);
      if (sections.has(kMasterField)) {
        const at::Tensor master = sections.tensor(kMasterField);
        if (masters_)
          owned_[i].detach().copy_(master.view({-1}).narrow(0, run.begin, run.length));
        else  // a float32 run: the trained value, whole on every rank
          trainable_[i].detach().copy_(master);
      } else if (masters_) {
        owned_[i].detach().copy_(trainable_[i].detach().view({-1}).narrow(0, run.begin, run.length));
      }
    }
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
