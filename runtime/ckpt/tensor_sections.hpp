// Tensor sections of a checkpoint: "<dtype> <d0,d1,...>\n" then the
// contiguous CPU bytes (loading never executes anything), and the parts made
// of them: the model's parameters and buffers, the RNG states.
#pragma once

#include <string>

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include "ckpt/stateful.hpp"
#include "common/named_tensors.hpp"

namespace kiln {

// Adds a CPU copy of `tensor` to `snapshot` as section `name`.
void add_tensor_section(CheckpointSnapshot& snapshot, const std::string& name, const at::Tensor& tensor);

// Copies section `name` into `target` after checking dtype and shape
// (`what` names the tensor in messages). `convert_floating`: a section of
// another floating-point dtype is cast into `target`, not refused.
void restore_tensor_section(const CheckpointFile& file, const std::string& name, const std::string& what,
                            at::Tensor& target, bool convert_floating = false);

// The tensor a "param/", "buffer/" or other tensor section holds, as a CPU
// tensor of its own dtype and shape. Throws CheckpointError naming the file
// and section when it is absent or not a tensor.
at::Tensor read_tensor_section(const CheckpointFile& file, const std::string& name);

// The model's parameters ("param/<name>") or buffers ("buffer/<name>"):
// the same names in the checkpoint and the model, each of the same dtype
// and shape.
class ModelTensorsPart : public Stateful {
 public:
  // `what`: "parameter" or "buffer", as messages name one.
  ModelTensorsPart(std::string prefix, const char* what, NamedTensors& tensors)
      : prefix_(std::move(prefix)), what_(what), tensors_(tensors) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void check(const CheckpointFile& file) const override;
  void load(const CheckpointFile& file) override;

 private:
  std::string prefix_;
  const char* what_;
  NamedTensors& tensors_;
};

// The host's RNG ("rng/cpu") and, on a CUDA device, that device's
// ("rng/cuda": dropout on the GPU; a checkpoint without one leaves it be).
class RngPart : public Stateful {
 public:
  explicit RngPart(c10::Device device) : device_(device) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void load(const CheckpointFile& file) override;

 private:
  c10::Device device_;
};

}  // namespace kiln
