// The host's sample indices for one batch, checked and wrapped for
// index_select — what every in-memory data module's get_batch starts with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

namespace kiln_plugins {

// Throws for an index outside a split of `size` samples: for a data module
// that reads its rows by pointer.
inline void check_sample_indices(const int64_t* indices, size_t count, int64_t size) {
  for (size_t i = 0; i < count; ++i)
    if (indices[i] < 0 || indices[i] >= size)
      throw std::out_of_range("sample index " + std::to_string(indices[i]) + " is out of range for a split of " +
                              std::to_string(size));
}

// `indices[0..count)` as a LongTensor view (no copy: index_select copies, so
// the borrowed indices need not outlive the call). Throws for an index
// outside a split of `size` samples.
inline at::Tensor sample_index(const int64_t* indices, size_t count, int64_t size) {
  check_sample_indices(indices, count, size);
  return torch::from_blob(const_cast<int64_t*>(indices), {static_cast<int64_t>(count)},
                          torch::TensorOptions(torch::kLong));
}

}  // namespace kiln_plugins
