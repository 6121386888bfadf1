// Two checkpoints' parameters compared as tensors, for runs that differ in
// how they sum (processes, nodes): each parameter within `tolerance`.
#pragma once

#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/tensor_sections.hpp"

namespace kiln::test {

// How many parameters were compared; each one's largest difference is
// expected under `tolerance`.
inline int expect_parameters_within(const std::filesystem::path& a_file, const std::filesystem::path& b_file,
                                    double tolerance) {
  const CheckpointFile a = CheckpointFile::read(a_file), b = CheckpointFile::read(b_file);
  int compared = 0;
  for (const auto& name : a.names()) {
    if (name.rfind("param/", 0) != 0) continue;
    const at::Tensor x = read_tensor_section(a, name), y = read_tensor_section(b, name);
    EXPECT_LT((x - y).abs().max().item<double>(), tolerance) << name;
    ++compared;
  }
  return compared;
}

}  // namespace kiln::test
