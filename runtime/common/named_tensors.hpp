// A model's tensors by name (parameters, buffers), in the model's order: the
// vocabulary the plugin proxies, the trainer and the checkpoint code share,
// so that none of them includes another for it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

}  // namespace kiln
