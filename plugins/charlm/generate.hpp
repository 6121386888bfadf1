// Text generation for `kiln predict`: continue each prompt one token at a
// time, feeding the model its last block_size tokens.
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "gpt.hpp"

namespace kiln_charlm {

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0: greedy (always the most likely token)
  int64_t top_k = 0;         // sample among the k most likely tokens; 0 = all
};

// The max_new_tokens tokens generated after each row of `prompts` (int64
// [N, T], on the model's device): int64 [N, max_new_tokens] on the CPU.
// Draws come from a CPU generator seeded with `seed`, so the text is the
// same on any device.
at::Tensor generate(Gpt& model, const at::Tensor& prompts, const SamplingOptions& options, uint64_t seed);

}  // namespace kiln_charlm
