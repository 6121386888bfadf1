// A run's state as a checkpoint holds it, in both directions: the parts it
// registers with the checkpointer (ckpt/checkpoint_parts.hpp: the position,
// the model's tensors, the RNGs, the plugins' own states, the metrics, the
// gradient scaler, the optimizer once fit makes it), what a commit brings
// up to date before they are saved, and a resume that restores them —
// refusing, before anything is written, a continuation that cannot be exact
// (another world size or batch size inside an epoch; docs/checkpoints.md).
// The loggers and the weight averaging register their own parts.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common/named_tensors.hpp"
#include "config/manifest.hpp"
#include "metrics/metrics_checkpoint.hpp"
#include "plugin/plugin_states.hpp"
#include "optim/optimizer_checkpoint.hpp"
#include "optim/scaler_checkpoint.hpp"
#include "train/command.hpp"
#include "train/run/run_metrics.hpp"
#include "train/run/run_settings.hpp"
#include "optim/scaler_state.hpp"

namespace kiln {

class Checkpointer;
class ProcessGroup;
class EpochCollections;
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
};

class RunCheckpoints {
 public:
  struct Parts {
    Checkpointer& checkpointer;
    TrainingState& state;
    RunMetrics& metrics;
    SampledBatches& batches;
    std::function<std::vector<const PluginInstance*>()> plugins;
    EpochCollections* collections;  // may be null
  };
  RunCheckpoints(const Manifest& manifest, const RunSettings& settings, int32_t rank, int32_t world_size,
                 c10::Device device, Parts parts);

  // Fit's optimizer, once made: its state and groups join the checkpoint.
  // `masters`: bf16-true's float32 copies of the trainable weights, which
  // the optimizer steps (null: it steps the model's).
  void register_optimizer(const std::vector<at::Tensor>* masters = nullptr);
  // distributed.shard = "parameters": every rank makes the weights whole
  // before each commit (collectives) and frees them after, so rank 0 writes
  // the param/ sections every other mode writes.
  void hold_whole_weights_while_committing(std::function<void()> gather, std::function<void()> release);
  // The same for an optimizer over `owned` elements only (distributed.shard
  // = "optimizer"): the checkpoint holds the whole state, gathered on
  // rank 0 at each commit. `masters`: `owned` are bf16-true's float32
  // copies of the elements, not views of them.
  void register_sharded_optimizer(const std::vector<at::Tensor>& owned, const ShardLayout& layout,
                                  ProcessGroup* group, bool masters = false);

  // Brings what the parts save up to a checkpoint at `position` (rank 0,
  // before the checkpointer saves them); returns the monitored value.
  std::optional<double> prepare(const TrainPosition& position, RunMetrics::Unreduced unreduced);
  // Restores `file` into the live run (after set-up, before the first
  // step); returns where a fit continues. `resume_point()` then names it
  // for the start-up agreement.
  TrainPosition resume(const std::filesystem::path& file, Command command);
  const std::string& resume_point() const { return resume_point_; }

 private:
  void check_continuation(const std::filesystem::path& file, const TrainPosition& position, const SavedBy& saved);
  int64_t steps_per_epoch(int64_t world, int64_t batch) const;

  const Manifest& m_;
  const RunSettings& settings_;
  int32_t rank_, world_size_;
  c10::Device device_;
  Parts parts_;
  std::string resume_point_;

  // What the parts below save and load.
  TrainPosition position_;
  SavedBy saved_by_;
  std::optional<double> monitored_;
  PluginStates plugin_states_;
  MetricsSections metrics_sections_;
  MetaPart meta_part_;
  ModelTensorsPart params_part_, buffers_part_;
  RngPart rng_part_;
  PluginStatesPart plugins_part_;
  MetricsPart metrics_part_;
  ScalerPart scaler_part_;
  std::optional<OptimizerPart> optimizer_part_;
  std::optional<ShardedOptimizerPart> sharded_optimizer_part_;
};

}  // namespace kiln
