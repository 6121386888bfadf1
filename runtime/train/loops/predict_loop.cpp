#include "train/loops/predict_loop.hpp"

#include <cmath>

#include <ATen/core/grad_mode.h>

#include "train/progress.hpp"
#include "util/errors.hpp"

namespace kiln {

PredictLoop::PredictLoop(LoopContext& context, EpochSpec spec) : context_(context), spec_(spec) {}

std::vector<at::Tensor> PredictLoop::run() {
  LoopContext& c = context_;
  std::vector<at::Tensor> outputs;
  at::NoGradGuard no_grad;
  std::unique_ptr<BatchStream> batches = c.data.open(KILN_SPLIT_PREDICT, spec_, 0, 0);
  const int64_t n = batches->size();
  c.progress.begin("predict", n);
  for (int64_t b = 0; b < n; ++b) {
    c.control.check_signal();
    BatchPtr batch = batches->next();
    outputs.push_back(c.model.predict_step(*batch, b).cpu());
    c.progress.step(b);
  }
  c.progress.end();
  if (outputs.empty()) c.data.refuse_empty(KILN_SPLIT_PREDICT, "the predict split is empty");
  return outputs;
}

}  // namespace kiln
