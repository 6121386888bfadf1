// Gradient synchronisation with c10d's own DDP Reducer: gradients are
// bucketed (25 MiB, the first bucket 1 MiB, as PyTorch's DDP) and all-reduced
// while backward is still running, and averaged over ranks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace c10d {
class Reducer;
}

namespace kiln {

class ProcessGroup;

class GradSync {
 public:
  // `parameters` are the trainable tensors (same order and shapes on every
  // rank; the start-up agreement has checked that).
  GradSync(ProcessGroup& group, const std::vector<at::Tensor>& parameters, const std::vector<std::string>& names);
  ~GradSync();

  void before_forward();
  // Call before loss.backward(). `sync` false accumulates locally (gradient
  // accumulation's early micro-batches), like DDP's no_sync().
  void before_backward(const at::Tensor& loss, bool sync);

 private:
  std::shared_ptr<c10d::Reducer> reducer_;
};

}  // namespace kiln
