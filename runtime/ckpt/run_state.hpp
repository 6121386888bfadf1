// What a checkpoint holds of a run, and how it goes back in: parameters,
// buffers, optimizer state, position (epoch, batch within it, global step),
// the host RNG, each plugin's own state, metrics. Sections are raw tensor
// bytes with a one-line header — loading never executes anything.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "ckpt/checkpoint_file.hpp"
#include "common/named_tensors.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "config/options.hpp"
#include "train/scaler_state.hpp"

namespace kiln {

using PluginStates = std::map<std::string, std::map<std::string, std::string>>;  // plugin id -> key -> bytes

// Everything a checkpoint carries, as references into the live run.
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
  std::string metrics_latest;       // MetricStore::export_latest()
  std::string metrics_pending;      // rank 0's MetricStore::export_pending(), for older kilns
  // Every rank's unreduced metrics, in rank order (MetricStore::export_state,
  // TensorMetrics::export_state): an interrupted epoch's metrics, exactly.
  // Empty when restored from a checkpoint of an older kiln.
  std::vector<std::string> metrics_state, tensor_metrics_state;
  SavedBy saved_by;                 // this run's world size and batch size
  std::string csv;                  // metrics.csv so far
  std::string loggers;              // the other loggers' states (metrics/loggers.hpp): where each file ends
  // 16-mixed's gradient scaler, nullptr in other precisions. A checkpoint
  // without one restores nothing into it (the scaler starts afresh).
  ScalerState* scaler = nullptr;
  // The run's device: a CUDA device's generator (dropout on the GPU) is
  // saved and restored beside the CPU's.
  c10::Device device{c10::kCPU};
};

// The tensor a "param/", "buffer/" or other tensor section holds, as a CPU
// tensor of its own dtype and shape. Throws CheckpointError naming the file
// and section when it is absent or not a tensor.
at::Tensor read_tensor_section(const CheckpointFile& file, const std::string& name);

// Writes a checkpoint of `state` to `file` with the commit protocol.
void save_run_state(const std::filesystem::path& file, const RunStateView& state);

// Checks `file` against the live model and, if it fits, restores it into
// `state` (tensors copied in place; optimizer state rebuilt; host RNG set;
// position, plugin states and metrics filled in). Throws CheckpointError with
// one line naming the file and the first mismatch, e.g.
//   "run/last.ckpt: shape of 'fc1.weight' is [256,784] in the checkpoint but [128,784] in the model".
void restore_run_state(const CheckpointFile& file, RunStateView& state);

}  // namespace kiln
