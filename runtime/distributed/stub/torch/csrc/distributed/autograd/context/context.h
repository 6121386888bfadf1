// Stand-in for LibTorch's distributed-autograd context header, which
// c10d/reducer.hpp includes but Debian's libtorch-dev does not ship. The
// Reducer only names these two types (it never uses distributed autograd in
// a plain DDP step), so declaring them is enough. This directory is on the
// include path only when the real header is missing (see runtime/CMakeLists.txt).
#pragma once

#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
