#include "optim/optimizer_checkpoint.hpp"

#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/rank_files.hpp"
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
  at::Tensor t = at::empty(param_.sizes(), param_.options().dtype(state_dtype_));
  restore_tensor_section(file_, prefix_ + field, prefix_ + field, t, /*convert_floating=*/true);
  return t;
}

int64_t ParamStateSections::count(const std::string& field) const {
  return parse_count(file_, "section '" + prefix_ + field + "'", file_.section(prefix_ + field));
}

namespace {

// One parameter's state split over a sharded run's rank files.
class RankFilesSections : public ParamStateReader {
 public:
  RankFilesSections(const std::vector<CheckpointFile>& ranks, const ShardLayout& layout, size_t index,
                    const at::Tensor& param, at::ScalarType state_dtype)
      : ranks_(ranks), layout_(layout), index_(index), prefix_("optim/" + std::to_string(index) + "/"), param_(param),
        state_dtype_(state_dtype) {}
  bool has(const std::string& field) const override {
    const CheckpointFile* first = first_holder();
    return first && first->has(prefix_ + field);
  }
  at::Tensor tensor(const std::string& field) const override {
    at::Tensor whole = at::empty(param_.sizes(), param_.options().dtype(state_dtype_));
    at::Tensor flat = whole.view({-1});
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const ShardLayout::Run run = layout_.owned(index_, static_cast<int64_t>(r));
      if (run.length == 0) continue;
      at::Tensor part = flat.narrow(0, run.begin, run.length);
      restore_tensor_section(ranks_[r], prefix_ + field, prefix_ + field, part, /*convert_floating=*/true);
    }
    return whole;
  }
  int64_t count(const std::string& field) const override {
    const CheckpointFile& first = *first_holder();
    return parse_count(first, "section '" + prefix_ + field + "'", first.section(prefix_ + field));
  }

 private:
  // The file of the first rank that owns any of the parameter's elements.
  const CheckpointFile* first_holder() const {
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (layout_.owned(index_, static_cast<int64_t>(r)).length > 0) return &ranks_[r];
    return nullptr;
  }
  const std::vector<CheckpointFile>& ranks_;
  const ShardLayout& layout_;
  size_t index_;
  std::string prefix_;
  const at::Tensor& param_;
  at::ScalarType state_dtype_;
};

}  // namespace

OptimizerStateSource::OptimizerStateSource(const CheckpointFile& file, const std::vector<at::Tensor>& trainable,
                                           at::ScalarType state_dtype)
    : file_(file), trainable_(trainable), state_dtype_(state_dtype), ranks_(read_rank_files(file)) {
  if (ranks_.empty()) return;
  std::vector<int64_t> numels;
  for (const auto& p : trainable) numels.push_back(p.numel());
  layout_.emplace(std::move(numels), static_cast<int64_t>(ranks_.size()), 0);
}

std::unique_ptr<ParamStateReader> OptimizerStateSource::reader(size_t index) const {
  if (layout_) return std::make_unique<RankFilesSections>(ranks_, *layout_, index, trainable_[index], state_dtype_);
  return std::make_unique<ParamStateSections>(file_, index, trainable_[index], state_dtype_);
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
    // Every master, stepped yet or not (SGD without momentum keeps no state).
    if (model_)
      for (size_t i = 0; i < trainable_->size(); ++i)
        add_tensor_section(snapshot, "optim/" + std::to_string(i) + "/" + kMasterField, (*trainable_)[i]);
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
  // The optimizer steps `trainable` (float32 masters, or the weights themselves).
  const OptimizerStateSource source(file, *trainable_,
                                    trainable_->empty() ? at::kFloat : trainable_->front().scalar_type());
  for (size_t i = 0; i < trainable_->size(); ++i) {
    const std::unique_ptr<ParamStateReader> reader = source.reader(i);
    const ParamStateReader& fields = *reader;
    {
      at::NoGradGuard no_grad;
      const at::Tensor& param = (*trainable_)[i];
      if (fields.has(kMasterField)) {
        const at::Tensor master = fields.tensor(kMasterField);
        param.detach().copy_(master);
        if (model_) (*model_)[i].detach().copy_(master);
      } else if (model_) {
        param.detach().copy_((*model_)[i]);
      }
    }
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
