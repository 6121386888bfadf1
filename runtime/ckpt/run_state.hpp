// What a checkpoint holds of a run, and how it goes back in: a list of
// named parts (ckpt/stateful.hpp), each beside its owner — the position and
// manifest ("meta", "manifest"), parameters and buffers, the optimizer's
// state and groups, the RNGs, each plugin's own state, the gradient scaler,
// the metrics. Sections are raw tensor bytes with a one-line header, or
// text — loading never executes anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common/named_tensors.hpp"
#include "config/options.hpp"
#include "metrics/metrics_checkpoint.hpp"
#include "plugin/plugin_states.hpp"
#include "train/scaler_state.hpp"

namespace kiln {

// [averaging]'s weights ("average/param/<name>", "average/buffer/<name>",
// "average/count"): the averaged floating-point tensors and the number of
// updates folded in.
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

// The run as its parts see it: references into the live run, and the
// exported states (metrics, plugins) a checkpoint carries as they are.
struct RunStateView {
  TrainPosition position;
  std::string manifest_text;
  std::string monitor;              // "" when none
  std::optional<double> monitored;  // its value at save time
  NamedTensors* params = nullptr;
  NamedTensors* buffers = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;   // nullptr outside fit
  const std::vector<at::Tensor>* trainable = nullptr;  // the optimizer's parameters, in order
  // The optimizer's parameter groups as train/param_groups.hpp describes
  // them ("optim/groups"); a resumed run must have the same.
  std::string optimizer_groups;
  PluginStates plugin_states;
  // metrics/metrics_checkpoint.hpp: the unreduced per-rank states are empty
  // when restored from a checkpoint of an older kiln.
  MetricsSections metrics;
  SavedBy saved_by;                 // this run's world size and batch size
  // 16-mixed's gradient scaler, nullptr in other precisions. A checkpoint
  // without one restores nothing into it (the scaler starts afresh).
  ScalerState* scaler = nullptr;
  // The run's device: a CUDA device's generator (dropout on the GPU) is
  // saved and restored beside the CPU's.
  c10::Device device{c10::kCPU};
  // [averaging]: nullptr without. A checkpoint without one restores nothing
  // into it (restored stays false).
  AveragedState* averaged = nullptr;
};

// The checkpoint of `state`, owning its bytes (tensors copied to the CPU):
// the live run may go on while it is written. `buffers`: host memory kept
// from an earlier snapshot, reused for the tensors' copies (nullptr: new).
CheckpointSnapshot snapshot_run_state(const RunStateView& state, SnapshotBuffers* buffers = nullptr);

// Writes a checkpoint of `state` to `file` with the commit protocol.
void save_run_state(const std::filesystem::path& file, const RunStateView& state);

// Checks `file` against the live model and, if it fits, restores it into
// `state` (tensors copied in place; optimizer state rebuilt; host RNG set;
// position, plugin states and metrics filled in). Throws CheckpointError with
// one line naming the file and the first mismatch, e.g.
//   "run/last.ckpt: shape of 'fc1.weight' is [256,784] in the checkpoint but [128,784] in the model".
void restore_run_state(const CheckpointFile& file, RunStateView& state);

}  // namespace kiln
