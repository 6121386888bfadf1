#include "generate.hpp"

#include <limits>

#include <ATen/CPUGeneratorImpl.h>

namespace kiln_charlm {

at::Tensor generate(Gpt& model, const at::Tensor& prompts, const SamplingOptions& options, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t block = model->options().block_size;
  at::Tensor context = prompts;
  at::Tensor out = at::empty({prompts.size(0), options.max_new_tokens}, at::kLong);
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (context.size(1) > block) context = context.narrow(1, context.size(1) - block, block);
    // The next token's logits only; in float32 on the CPU, so the draws do
    // not depend on the device or on the precision the model ran in.
    at::Tensor logits = model->forward(context).select(1, -1).to(at::kCPU, at::kFloat);
    at::Tensor next;
    if (options.temperature <= 0.0) {
      next = logits.argmax(-1, /*keepdim=*/true);
    } else {
      logits.div_(options.temperature);
      if (options.top_k > 0 && options.top_k < logits.size(-1)) {
        const at::Tensor kth = std::get<0>(logits.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
        logits.masked_fill_(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = at::multinomial(logits.softmax(-1), 1, /*replacement=*/false, generator);
    }
    out.select(1, step).copy_(next.squeeze(1));
    context = at::cat({context, next.to(context.device())}, 1);
  }
  return out;
}

}  // namespace kiln_charlm
