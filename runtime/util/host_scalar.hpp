#pragma once
// A one-element float32 or float64 tensor in host memory, read where it
// lies: no operator is dispatched (item() dispatches two, ~1 k instructions
// a call) and nothing waits (a CPU step has computed the value already).
// Used every training step, for the loss's metric and its non-finite check.
#include <optional>

#include <ATen/core/Tensor.h>

namespace kiln {

inline std::optional<double> host_scalar(const at::Tensor& value) {
  if (!value.defined() || !value.device().is_cpu() || value.numel() != 1) return std::nullopt;
  if (value.scalar_type() == at::kFloat) return *static_cast<const float*>(value.data_ptr());
  if (value.scalar_type() == at::kDouble) return *static_cast<const double*>(value.data_ptr());
  return std::nullopt;
}

}  // namespace kiln
