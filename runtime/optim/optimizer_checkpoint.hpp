// The optimizer's part of a checkpoint: each parameter's state as sections
// "optim/<i>/<field>" (the fields its registry entry gives) and the groups
// as optim/param_groups.hpp describes them ("optim/groups"). A resumed run
// must have the same optimizer and groups.
//
// bf16-true (optim/master_weights.hpp) adds "optim/<i>/master": parameter
// i's float32 master, which the optimizer steps (the "param/" section holds
// the model's bfloat16 weight). Where a checkpoint has one it is the
// parameter's trained value: a bf16-true run takes it as its master, a
// float32 run as the weight itself; a bf16-true run resuming a checkpoint
// without one starts its master from the (bfloat16) weight.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "ckpt/stateful.hpp"
#include "optim/optim_registry.hpp"
#include "optim/shard_layout.hpp"

namespace kiln {

class ProcessGroup;

// The registry entry that built `optimizer`; std::logic_error for one kiln
// did not build.
const OptimizerEntry& entry_of(const torch::optim::Optimizer& optimizer);

// The field of a parameter's float32 master (bf16-true).
inline constexpr const char* kMasterField = "master";

// One parameter's "optim/<i>/" sections of a checkpoint, each shaped like
// `param` and typed `state_dtype`: the dtype this run's optimizer steps in
// (float32 for bf16-true's masters, bfloat16 without them). A floating
// section of another dtype converts (a resume with or without masters
// takes the other's moments, rounded or widened).
class ParamStateSections : public ParamStateReader {
 public:
  ParamStateSections(const CheckpointFile& file, size_t index, const at::Tensor& param, at::ScalarType state_dtype)
      : file_(file), prefix_("optim/" + std::to_string(index) + "/"), param_(param), state_dtype_(state_dtype) {}
  bool has(const std::string& field) const override;
  at::Tensor tensor(const std::string& field) const override;
  int64_t count(const std::string& field) const override;

 private:
  const CheckpointFile& file_;
  std::string prefix_;
  const at::Tensor& param_;
  at::ScalarType state_dtype_;
};

// Where a checkpoint keeps each parameter's optimizer state: its own
// "optim/<i>/" sections, or, from a run with distributed.shard and rank
// files (ckpt/rank_files.hpp), split over every rank's file by that run's
// ShardLayout (its world size; the parameters are this run's: a different
// model is refused by the shapes). Every rank reads the whole state of a
// parameter this way; a sharded run then keeps its own elements.
class OptimizerStateSource {
 public:
  // `state_dtype`: the dtype of the state this run steps (ParamStateSections).
  OptimizerStateSource(const CheckpointFile& file, const std::vector<at::Tensor>& trainable,
                       at::ScalarType state_dtype);
  std::unique_ptr<ParamStateReader> reader(size_t index) const;

 private:
  const CheckpointFile& file_;
  const std::vector<at::Tensor>& trainable_;
  at::ScalarType state_dtype_;
  std::vector<CheckpointFile> ranks_;
  std::optional<ShardLayout> layout_;
};

class OptimizerPart : public Stateful {
 public:
  // `trainable`: the optimizer's parameters, in order (nullptr: no state
  // saved or loaded). `groups`: describe_param_groups(), "" for none.
  // `model`: bf16-true's bfloat16 parameters, whose float32 masters
  // `trainable` is (nullptr: `trainable` is the model's).
  OptimizerPart(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>* trainable, const std::string& groups,
                const std::vector<at::Tensor>* model = nullptr)
      : optimizer_(optimizer), trainable_(trainable), groups_(groups), model_(model) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void check(const CheckpointFile& file) const override;
  void load(const CheckpointFile& file) override;

 private:
  torch::optim::Optimizer& optimizer_;
  const std::vector<at::Tensor>* trainable_;
  const std::string& groups_;
  const std::vector<at::Tensor>* model_;
};

// distributed.shard = "optimizer" (optim/sharded_step.hpp): the same
// sections as OptimizerPart's, of the whole state, so that a sharded
// checkpoint resumes with any world size, sharded or replicated, and a
// sharded run resumes a replicated one. gather(), on every rank before a
// commit, brings every rank's owned elements to rank 0, field by field;
// load(), on every rank, keeps the elements the rank owns.
class ShardedOptimizerPart : public Stateful {
 public:
  // `optimizer` is over `owned` (ShardedStep::owned_views of `trainable`,
  // or with `masters` bf16-true's float32 copies of those elements).
  ShardedOptimizerPart(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& owned,
                       const std::vector<at::Tensor>& trainable, const ShardLayout& layout, ProcessGroup* group,
                       const std::string& groups, bool masters = false)
      : optimizer_(optimizer), owned_(owned), trainable_(trainable), layout_(layout), group_(group),
        masters_(masters), groups_part_(optimizer, nullptr, groups) {}
  void gather();
  // Rank files: each rank saves its own elements' state (rank_part()) and
  // gather() has nothing to do; this part then saves only the groups.
  Stateful& rank_part() { return owned_part_; }
  void write_rank_files() { rank_files_ = true; }
  void save(CheckpointSnapshot& snapshot) const override;
  void check(const CheckpointFile& file) const override { groups_part_.check(file); }
  void load(const CheckpointFile& file) override;

 private:
  torch::optim::Optimizer& optimizer_;
  const std::vector<at::Tensor>& owned_;
  const std::vector<at::Tensor>& trainable_;
  const ShardLayout& layout_;
  ProcessGroup* group_;
  bool masters_;
  OptimizerPart groups_part_;  // "optim/groups" and its check
  // This rank's fields of parameter i: its optimizer state's (if any) and,
  // with masters, its master's elements.
  std::optional<ParamStateFields> own_fields(size_t i) const;
  // This rank's elements' state, as its rank file holds it: each parameter's
  // run as a 1-D tensor per field ("optim/<i>/<field>"), none for an empty run.
  class OwnedStatePart : public Stateful {
   public:
    explicit OwnedStatePart(const ShardedOptimizerPart& whole) : whole_(whole) {}
    void save(CheckpointSnapshot& snapshot) const override;
    void load(const CheckpointFile&) override {}  // read through the checkpoint's OptimizerStateSource

   private:
    const ShardedOptimizerPart& whole_;
  } owned_part_{*this};
  bool rank_files_ = false;
  // Rank 0, from gather() until save() has copied it into the snapshot:
  // each parameter's whole state.
  mutable std::vector<std::optional<ParamStateFields>> gathered_;
};

}  // namespace kiln
