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

namespace torch::_export {
class ExportedProgram;
}

namespace kiln_exported {

class GraphProgram {
 public:
  // Binds `program` (named `name` in the archive `archive`, for messages) to
  // the model's parameters and buffers by state_dict name. Throws Pt2Error
  // (one line: the node, its operator, what is wrong) for what kiln cannot
  // run: an operator this LibTorch lacks, a higher-order operator, a
  // dynamic dimension other than the batch, an input or output kind other
  // than tensors.
  // `constants`: the program's lifted tensor constants, by name.
  GraphProgram(const torch::_export::ExportedProgram& program, const std::string& archive, const std::string& name,
               const std::map<std::string, at::Tensor>& state, const std::map<std::string, at::Tensor>& constants);
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
  // The operators the program calls, with how many nodes call each.
  const std::map<std::string, int>& operators() const;
  size_t node_count() const;

 private:
  void bind(const torch::_export::ExportedProgram& program, const std::map<std::string, at::Tensor>& state,
            const std::map<std::string, at::Tensor>& constants);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln_exported
