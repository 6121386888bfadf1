// [averaging]'s part of a checkpoint ("average/param/<name>",
// "average/buffer/<name>", "average/count", "average/kind"): the averaged
// floating-point tensors and the number of updates folded in.
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/stateful.hpp"
#include "common/named_tensors.hpp"

namespace kiln {

struct AveragedState {
  NamedTensors tensors;  // names "param/<name>" and "buffer/<name>"
  int64_t count = 0;
  std::string kind;       // "ema" or "swa": what the count and tensors mean
  bool restored = false;  // set by a restore that found them
  // The restored average's kind ("" from a checkpoint older than
  // average/kind): another than `kind`, a fit cannot continue it (an EMA is
  // no mean of epoch ends, nor the reverse), an evaluation can use it.
  std::string restored_kind;
};

// A checkpoint without an average restores nothing (restored stays false).
class AveragedPart : public Stateful {
 public:
  explicit AveragedPart(AveragedState& state) : state_(state) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void check(const CheckpointFile& file) const override;
  void load(const CheckpointFile& file) override;

 private:
  AveragedState& state_;
};

}  // namespace kiln
