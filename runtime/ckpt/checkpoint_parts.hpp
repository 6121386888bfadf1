// What a checkpoint holds: the parts its owners registered, each a Stateful
// (ckpt/stateful.hpp) under a name of its own — as torchtitan's
// CheckpointManager takes `states: dict[str, Stateful]`. The position, the
// model's tensors, the optimizer, the RNGs, the plugins' own states, the
// gradient scaler, the metrics, the loggers and the averaged weights are
// each registered by the component that owns them, so a new kind of state
// is one registration, not an edit of a list here. No LibTorch here.
#pragma once

#include <string>
#include <vector>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/stateful.hpp"

namespace kiln {

class CheckpointParts {
 public:
  // Registers `part` (referenced, not owned: it must outlive its
  // registration) under `name`. The file holds the parts in the order they
  // were registered; a restore loads them by `load_priority`, lower first,
  // in registration order among equals (the model's tensors and the RNGs
  // before the position, and the position before what reads it). Throws
  // std::invalid_argument for a name registered twice.
  void add(const std::string& name, Stateful& part, int load_priority);
  // Registers `part` in place of the one under `name`, or adds it.
  void replace(const std::string& name, Stateful& part, int load_priority);
  void remove(const std::string& name);
  bool has(const std::string& name) const;

  // Every part's sections, in registration order. `buffers` (may be null):
  // host memory kept from an earlier snapshot for the tensors' copies.
  CheckpointSnapshot snapshot(SnapshotBuffers* buffers = nullptr) const;
  // Every part's check first (a checkpoint of another model is named as
  // such, not as a shape error on its first tensor), then every part's load
  // in priority order. Throws CheckpointError.
  void restore(const CheckpointFile& file) const;

 private:
  struct Entry {
    std::string name;
    Stateful* part;
    int load_priority;
  };
  std::vector<Entry> parts_;
};

// The load priorities kiln's own parts use.
namespace load_priority {
constexpr int model = 0;     // parameters, buffers, optimizer state, RNGs
constexpr int position = 1;  // "meta": where the run continues, who saved it
constexpr int run = 2;       // what follows the position: plugins, scaler, metrics, loggers, averages
}  // namespace load_priority

}  // namespace kiln
