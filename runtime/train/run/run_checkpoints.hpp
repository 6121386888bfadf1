// A run's state as a checkpoint holds it (ckpt/run_state), in both
// directions: the snapshot a commit writes, and a resume that restores one
// into the live run — refusing, before anything is written, a continuation
// that cannot be exact (another world size or batch size inside an epoch;
// docs/checkpoints.md).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "ckpt/run_state.hpp"
#include "config/manifest.hpp"
#include "train/command.hpp"
#include "train/run/run_metrics.hpp"
#include "train/run/run_settings.hpp"
#include "train/scaler_state.hpp"

namespace kiln {

class EpochCollections;
class Loggers;
class PluginInstance;
class SampledBatches;

// The model's training state, owned by the run: what the optimizer steps.
struct TrainingState {
  NamedTensors params, buffers;
  std::vector<at::Tensor> trainable;  // the optimizer's parameters, in order
  std::vector<std::string> trainable_names;
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // fit only
  std::string optimizer_groups;                        // describe_param_groups(), for checkpoints
  ScalerState scaler;                                  // 16-mixed's gradient scaler
  AveragedState* averaged = nullptr;                   // [averaging]'s weights, when on
};

class RunCheckpoints {
 public:
  struct Parts {
    TrainingState& state;
    RunMetrics& metrics;
    Loggers& loggers;
    SampledBatches& batches;
    std::function<std::vector<const PluginInstance*>()> plugins;
    EpochCollections* collections;  // may be null
  };
  RunCheckpoints(const Manifest& manifest, const RunSettings& settings, int32_t rank, int32_t world_size,
                 c10::Device device, Parts parts);

  // What a checkpoint at `position` holds (rank 0).
  RunStateView snapshot(const TrainPosition& position, RunMetrics::Unreduced unreduced) const;
  // Restores `file` into the live run (after set-up, before the first
  // step); returns where a fit continues. `resume_point()` then names it
  // for the start-up agreement.
  TrainPosition resume(const std::filesystem::path& file, Command command);
  const std::string& resume_point() const { return resume_point_; }

 private:
  RunStateView view(const TrainPosition& position) const;
  void check_continuation(const std::filesystem::path& file, const TrainPosition& position, const SavedBy& saved);
  int64_t steps_per_epoch(int64_t world, int64_t batch) const;

  const Manifest& m_;
  const RunSettings& settings_;
  int32_t rank_, world_size_;
  c10::Device device_;
  Parts parts_;
  std::string resume_point_;
};

}  // namespace kiln
