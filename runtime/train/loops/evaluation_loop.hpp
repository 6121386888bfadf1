// One pass over the validation or the test split (the same loop, parameterised
// by split): no gradients, no shuffling, every sample counted once across
// ranks, metrics reduced at the end. Used inside fit and by `kiln validate`
// and `kiln test`.
#pragma once

#include <map>
#include <string>

#include "loop_parts/loop_parts.hpp"

namespace kiln {

class EvaluationLoop {
 public:
  // `standalone`: `kiln validate|test` (its own stage, logs and a CSV row)
  // rather than a pass inside fit.
  EvaluationLoop(LoopContext& context, kiln_split split, EpochSpec spec, bool standalone);

  // Runs the pass; `epoch` is the fit epoch it belongs to (for callbacks).
  std::map<std::string, double> run(int64_t epoch = 0);

  // Lightning's sanity check: the first `max_batches` batches of this rank
  // (-1: all) through the model's step before training starts, so a bug
  // there shows in seconds. No callback events, no collected rows, no
  // collective: what the steps record is dropped, and a step's failure says
  // it happened in the sanity check.
  void sanity_check(int64_t max_batches);

 private:
  // Every batch of `batches` through the model's step under a progress
  // display titled `title`; returns how many. In the sanity check a step's
  // failure says where it happened.
  int64_t step_through(BatchStream& batches, const std::string& title, bool in_sanity_check);

  LoopContext& context_;
  kiln_split split_;
  EpochSpec spec_;
  bool standalone_;
};

}  // namespace kiln
