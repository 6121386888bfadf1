// Gradient synchronisation with c10d's own DDP Reducer: gradients are
// bucketed (25 MiB, the first 1 MiB, as PyTorch's DDP) and all-reduced
// while backward is still running, and averaged over ranks. Between the ranks
// of one host the Reducer's group is the shared-memory one when the process
// group has it (ProcessGroup::gradient_group). With gradient compression the
// buckets travel as bfloat16 or float16 (DDP's bf16/fp16 compression hooks):
// half the bytes, each rank's contribution rounded once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "config/options.hpp"

namespace c10d {
class Reducer;
}

namespace kiln {

class ProcessGroup;

class GradSync {
 public:
  // `parameters` are the trainable tensors (same order and shapes on every
  // rank; the start-up agreement has checked that).
  GradSync(ProcessGroup& group, const std::vector<at::Tensor>& parameters, const std::vector<std::string>& names,
           GradientCompression compression = GradientCompression::none);
  ~GradSync();

  void before_forward();
  // Call before loss.backward(). `sync` false accumulates locally (gradient
  // accumulation's early micro-batches), like DDP's no_sync().
  void before_backward(const at::Tensor& loss, bool sync);
  // Seconds waited for other ranks in the all-reduce so far, and its calls
  // (the shared-memory transport's; Gloo's: zeros).
  std::pair<double, int64_t> waited() const;

 private:
  ProcessGroup* group_;
  std::shared_ptr<c10d::Reducer> reducer_;
};

}  // namespace kiln
