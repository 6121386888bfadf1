// `kiln predict`: the predict split in order, unsharded, outputs gathered on
// the host. What is done with them (predictions.pt) is the caller's.
#pragma once

#include <vector>

#include "loop_parts/loop_parts.hpp"

namespace kiln {

class PredictLoop {
 public:
  PredictLoop(LoopContext& context, EpochSpec spec);
  // The outputs of every batch, on the CPU, in order.
  std::vector<at::Tensor> run();

 private:
  LoopContext& context_;
  EpochSpec spec_;
};

}  // namespace kiln
