// One exported program (torch.export's ATen graph), run node by node through
// LibTorch's dispatcher. Each node's operator handle and the layout of its
// arguments (which come from the graph's values, which are constants, which
// are the operator's defaults) are resolved once, when the program is
// bound; a call then only fills a stack per node and calls the operator.
// With the parameters as leaf tensors that require gradients, autograd
// records the calls like any C++ module's: no Python and no joint graph.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

namespace torch::_export {
class ExportedProgram;
}

namespace kiln_exported {

// Activation checkpointing: the nodes of the modules whose names match one
// of `modules` (globs, as fnmatch reads them, over the module names of each
// node's nn_module_stack: "layers.*"), run without keeping their
// activations and recomputed in backward.
struct Recompute {
  std::vector<std::string> modules;
};

class GraphProgram {
 public:
  // Binds `program` (named `name` in the archive `archive`, for messages) to
  // the model's parameters and buffers by state_dict name. Throws Pt2Error
  // (one line: the node, its operator, what is wrong) for what kiln cannot
  // run: an operator this LibTorch lacks, a higher-order operator, a
  // dynamic dimension other than the batch, an input or output kind other
  // than tensors.
  // `constants`: the program's lifted tensor constants, by name.
  // `unplaced`: the non-persistent buffers, by state_dict name: the module's
  // tensors that are not in its state_dict (so not placed on the run's
  // device by the runtime, not checkpointed, not exported); a run moves them
  // in place to where its inputs are.
  GraphProgram(const torch::_export::ExportedProgram& program, const std::string& archive, const std::string& name,
               const std::map<std::string, at::Tensor>& state, const std::map<std::string, at::Tensor>& constants,
               const std::map<std::string, at::Tensor>& unplaced, const Recompute& recompute = {});
  ~GraphProgram();
  GraphProgram(GraphProgram&&) noexcept;
  GraphProgram& operator=(GraphProgram&&) noexcept;

  // The program's user outputs for its user inputs (one per input, in the
  // order the exported forward took them). Throws kiln::InvalidInput when an
  // input's shape is not the program's (both shapes named).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const;
  // What run() checks of its inputs, without running: their count and
  // shapes (any first dimension with `any_batch_size`, for a sample of the
  // data whose batch size is not the run's). Throws as run() does.
  void check_inputs(const std::vector<at::Tensor>& inputs, bool any_batch_size) const;

  // Each input's shape, the first (batch) dimension as -1 where it is dynamic.
  const std::vector<std::vector<int64_t>>& input_shapes() const;
  // Each input's name in the graph (the forward's argument, or the batch
  // dict's key it was exported with) and dtype (none where unrecorded).
  const std::vector<std::string>& input_names() const;
  const std::vector<std::optional<at::ScalarType>>& input_dtypes() const;
  // The operators the program calls, with how many nodes call each.
  const std::map<std::string, int>& operators() const;
  size_t node_count() const;
  size_t output_count() const;
  // How many of the program's nodes activation checkpointing recomputes.
  size_t recomputed_nodes() const;
  // The module names of its nodes' nn_module_stack ("model.layers.0", ...).
  const std::vector<std::string>& module_names() const;

 private:
  void bind(const torch::_export::ExportedProgram& program, const std::map<std::string, at::Tensor>& state,
            const std::map<std::string, at::Tensor>& constants, const std::map<std::string, at::Tensor>& unplaced,
            const Recompute& recompute);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln_exported
