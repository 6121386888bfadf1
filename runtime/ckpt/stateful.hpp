// A part of a run that a checkpoint holds (docs/checkpoints.md): it saves
// its named sections into a snapshot and loads them back. The snapshot owns
// what is saved (tensors copied to CPU bytes), so it outlives the live
// run's next step: what an asynchronous writer needs. No LibTorch here.
#pragma once

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_writer.hpp"

namespace kiln {

class Stateful {
 public:
  virtual ~Stateful() = default;
  // Adds this part's sections to `snapshot`, in the order the file has them.
  virtual void save(CheckpointSnapshot& snapshot) const = 0;
  // Refuses `file` before any part is loaded: a checkpoint of another model
  // or optimization is named as such, not as its first mismatching tensor.
  virtual void check(const CheckpointFile& file) const { (void)file; }
  // Loads this part's sections; throws CheckpointError with one line naming
  // the file and the problem.
  virtual void load(const CheckpointFile& file) = 0;
};

}  // namespace kiln
