// The optimizer's part of a checkpoint: each parameter's state as sections
// "optim/<i>/<field>" (the fields its registry entry gives) and the groups
// as optim/param_groups.hpp describes them ("optim/groups"). A resumed run
// must have the same optimizer and groups.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "ckpt/stateful.hpp"

namespace kiln {

class OptimizerPart : public Stateful {
 public:
  // `trainable`: the optimizer's parameters, in order (nullptr: no state
  // saved or loaded). `groups`: describe_param_groups(), "" for none.
  OptimizerPart(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>* trainable, const std::string& groups)
      : optimizer_(optimizer), trainable_(trainable), groups_(groups) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void check(const CheckpointFile& file) const override;
  void load(const CheckpointFile& file) override;

 private:
  torch::optim::Optimizer& optimizer_;
  const std::vector<at::Tensor>* trainable_;
  const std::string& groups_;
};

}  // namespace kiln
