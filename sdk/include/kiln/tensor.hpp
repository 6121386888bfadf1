// kiln/tensor.hpp — kiln_tensor handles <-> at::Tensor, for plugins linked
// against the host's LibTorch.
//
// A handle is a c10::TensorImpl* carrying one intrusive reference, so the
// conversion is a pointer cast: no copy, and autograd history is kept (a loss
// built in a plugin back-propagates through the plugin's graph in the host).
// The loader guarantees plugin and host share one LibTorch major.minor.
#pragma once

#include <stdexcept>

#include <ATen/ATen.h>

#include "kiln/abi.h"

namespace kiln {

// A new at::Tensor sharing the handle's tensor; the handle keeps its reference.
inline at::Tensor borrow_tensor(const kiln_tensor* handle) {
  if (handle == nullptr) throw std::invalid_argument("null kiln_tensor handle");
  auto* impl = reinterpret_cast<c10::TensorImpl*>(const_cast<kiln_tensor*>(handle));
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
}

// Takes over the handle's reference.
inline at::Tensor adopt_tensor(kiln_tensor* handle) {
  if (handle == nullptr) throw std::invalid_argument("null kiln_tensor handle");
  auto* impl = reinterpret_cast<c10::TensorImpl*>(handle);
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(impl));
}

// Gives up the tensor's reference to a new owned handle.
inline kiln_tensor* release_tensor(at::Tensor tensor) {
  if (!tensor.defined()) throw std::invalid_argument("cannot hand an undefined tensor to kiln");
  return reinterpret_cast<kiln_tensor*>(tensor.unsafeReleaseTensorImpl());
}

}  // namespace kiln
