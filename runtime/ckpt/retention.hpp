// Which checkpoints a run keeps, and which one `--resume last|best` means.
// No LibTorch and no file contents here: decisions are made on names,
// metadata and validity the caller supplies, so they are unit-testable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/options.hpp"

namespace kiln {

// What the directory scan knows of one committed checkpoint.
struct CheckpointInfo {
  std::filesystem::path path;
  int64_t epoch = 0;
  int64_t global_step = 0;
  std::optional<double> monitored;  // the monitored metric's value, if any
  bool is_last = false;             // the file named last.ckpt
};

struct RetentionPolicy {
  std::string monitor;       // "" = none: top-k keeps the newest k
  MonitorMode mode = MonitorMode::min;
  int64_t save_top_k = 1;    // -1 keeps all; 0 keeps none (only last)
};

// The checkpoint file name for a step: "epoch=0003-step=000001200.ckpt".
std::string checkpoint_name(int64_t epoch, int64_t global_step);

// Given every ranked (non-"last") checkpoint, including the one just
// committed, the ones to delete now. Ties keep the newer (higher step).
std::vector<std::filesystem::path> to_delete(const std::vector<CheckpointInfo>& ranked, const RetentionPolicy& policy);

// `--resume last`: last.ckpt if valid, else the valid checkpoint with the
// highest global step. `--resume best`: the valid ranked checkpoint best by
// the monitor (newest if no monitor). nullopt when none qualifies.
std::optional<CheckpointInfo> pick_last(const std::vector<CheckpointInfo>& valid);
std::optional<CheckpointInfo> pick_best(const std::vector<CheckpointInfo>& valid, const RetentionPolicy& policy);

}  // namespace kiln
