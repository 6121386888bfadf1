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
#include "config/options.hpp"

namespace kiln {

struct TrainPosition {
  int64_t epoch = 0;       // the epoch to run next (or continue)
  int64_t next_batch = 0;  // the batch of that epoch to run next
  int64_t global_step = 0;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
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
  PluginStates plugin_states;
  std::string metrics_latest;       // MetricStore::export_latest()
  std::string metrics_pending;      // MetricStore::export_pending() (mid-epoch)
  std::string csv;                  // metrics.csv so far
};

// Writes a checkpoint of `state` to `file` with the commit protocol.
void save_run_state(const std::filesystem::path& file, const RunStateView& state);

// Checks `file` against the live model and, if it fits, restores it into
// `state` (tensors copied in place; optimizer state rebuilt; host RNG set;
// position, plugin states and metrics filled in). Throws CheckpointError with
// one line naming the file and the first mismatch, e.g.
//   "run/last.ckpt: shape of 'fc1.weight' is [256,784] in the checkpoint but [128,784] in the model".
void restore_run_state(const CheckpointFile& file, RunStateView& state);

// The metadata of a checkpoint without touching the model (for retention and
// `--resume best`).
struct CheckpointMeta {
  TrainPosition position;
  std::string monitor;
  std::optional<double> monitored;
  std::string kiln_version;
};
CheckpointMeta read_meta(const CheckpointFile& file);

// Publishes a committed checkpoint under a second name (last.ckpt) with a
// hard link made under a temporary name, renamed over `final`, directory
// fsynced: atomic, and no second copy of the bytes.
void link_checkpoint(const std::filesystem::path& existing, const std::filesystem::path& final);

// `--resume PATH|last|best` to one valid checkpoint file. "last" and "best"
// search `dir`, skipping (with a warning) files that fail validation; an
// explicit path that fails validation is an InputError naming the problem.
std::filesystem::path resolve_resume(const std::string& spec, const std::filesystem::path& dir,
                                     const std::string& monitor, MonitorMode mode);

}  // namespace kiln
