// trainer.precision = "bf16-true": the model's weights are bfloat16, and the
// optimizer steps float32 copies of the trainable ones (master weights, as
// Megatron's and DeepSpeed's bf16 optimizers keep). A bfloat16 weight keeps
// 8 significant bits: an update smaller than 1/256 of the weight rounds away
// entirely, so Adam stepping bfloat16 weights with bfloat16 moments stalls
// where float32 trains. The masters start from the bfloat16 weights; each
// step takes the model's bfloat16 gradients as float32, steps the masters
// and rounds them back into the model.
//
// A replicated step (optim/replicated_step.hpp) holds every master; a
// sharded one (optim/sharded_step.hpp) only the elements its rank owns, so
// that the float32 copies and the optimizer's state cost 12/N bytes a value
// with Adam, where the bfloat16 weights cost 2.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/shard_layout.hpp"

namespace kiln {

// Whole float32 copies of `model`'s parameters, one each, in order.
std::vector<at::Tensor> whole_masters(const std::vector<at::Tensor>& model);

// Float32 copies of the elements of `model` this rank owns in `layout`, one
// 1-D tensor per parameter (empty where it owns none). Throws InputError
// (one line) for parameters it cannot shard: not contiguous, or on more than
// one device.
std::vector<at::Tensor> owned_masters(const std::vector<at::Tensor>& model, const ShardLayout& layout);

// Before clipping: each model gradient, as float32, becomes its master's
// gradient, whose were cleared after the last step (undefined where the
// model's is); the model's are dropped.
void gradients_to_masters(const std::vector<at::Tensor>& model, const std::vector<at::Tensor>& masters);

// After the step: each whole master, rounded to the model's dtype, into
// its parameter.
void masters_to_model(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& model);

}  // namespace kiln
