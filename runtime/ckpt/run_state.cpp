#include "ckpt/run_state.hpp"

#include <cstdlib>

#include "train/optimizer_checkpoint.hpp"
#include "train/scaler_checkpoint.hpp"

namespace kiln {

namespace {

class AveragedPart : public Stateful {
 public:
  explicit AveragedPart(AveragedState& state) : state_(state) {}
  void save(CheckpointSnapshot& snapshot) const override {
    snapshot.add("average/count", std::to_string(state_.count));
    snapshot.add("average/kind", state_.kind);
    for (const auto& [name, t] : state_.tensors) add_tensor_section(snapshot, "average/" + name, t);
  }
  void check(const CheckpointFile& file) const override {
    if (!file.has("average/count")) return;
    for (const auto& [name, t] : state_.tensors)
      if (!file.has("average/" + name))
        throw CheckpointError(file.path().string() + ": the averaged weights have no '" + name +
                              "' (a checkpoint of another model?)");
  }
  void load(const CheckpointFile& file) override {
    if (!file.has("average/count")) return;
    const std::string count(file.section("average/count"));
    char* end = nullptr;
    const long long n = std::strtoll(count.c_str(), &end, 10);
    if (count.empty() || *end != '\0' || n < 0)
      throw CheckpointError(file.path().string() + ": average/count is not a count ('" + count + "')");
    state_.restored_kind = file.has("average/kind") ? std::string(file.section("average/kind")) : "";
    for (auto& [name, t] : state_.tensors) restore_tensor_section(file, "average/" + name, "averaged " + name, t);
    state_.count = n;
    state_.restored = true;
  }

 private:
  AveragedState& state_;
};

// The parts of a run a checkpoint holds, over a view of it.
class RunParts {
 public:
  explicit RunParts(RunStateView& s)
      : meta_({s.position, s.saved_by, s.monitor, s.monitored, s.manifest_text}),
        params_("param/", "parameter", *s.params),
        buffers_("buffer/", "buffer", *s.buffers),
        rng_(s.device),
        plugins_(s.plugin_states),
        metrics_(s.metrics, s.saved_by) {
    if (s.optimizer) optimizer_.emplace(*s.optimizer, s.trainable, s.optimizer_groups);
    if (s.scaler) scaler_.emplace(*s.scaler);
    if (s.averaged) averaged_.emplace(*s.averaged);
  }

  // The order the file holds them in.
  std::vector<Stateful*> in_file_order() {
    return present({&meta_, &params_, &buffers_, optional(optimizer_), &rng_, &plugins_, optional(scaler_), &metrics_,
                    optional(averaged_)});
  }
  // The order they are loaded in: the model's tensors and the RNGs first,
  // then the position ("meta") and what follows it in the file.
  std::vector<Stateful*> in_load_order() {
    return present({&params_, &buffers_, optional(optimizer_), &rng_, &meta_, &plugins_, optional(scaler_), &metrics_,
                    optional(averaged_)});
  }

 private:
  template <typename Part>
  static Stateful* optional(std::optional<Part>& part) {
    return part ? &*part : nullptr;
  }
  static std::vector<Stateful*> present(std::vector<Stateful*> parts) {
    std::vector<Stateful*> out;
    for (Stateful* part : parts)
      if (part) out.push_back(part);
    return out;
  }

  MetaPart meta_;
  ModelTensorsPart params_, buffers_;
  std::optional<OptimizerPart> optimizer_;
  RngPart rng_;
  PluginStatesPart plugins_;
  std::optional<ScalerPart> scaler_;
  MetricsPart metrics_;
  std::optional<AveragedPart> averaged_;
};

}  // namespace

CheckpointSnapshot snapshot_run_state(const RunStateView& state, SnapshotBuffers* buffers) {
  // The parts hold the view by reference for loading too; saving only reads it.
  RunParts parts(const_cast<RunStateView&>(state));
  CheckpointSnapshot snapshot(buffers);
  for (const Stateful* part : parts.in_file_order()) part->save(snapshot);
  return snapshot;
}

void save_run_state(const std::filesystem::path& file, const RunStateView& state) {
  commit_checkpoint(file, snapshot_run_state(state));
}

void restore_run_state(const CheckpointFile& file, RunStateView& state) {
  RunParts parts(state);
  // Every part's refusal first (names of parameters and buffers, the
  // optimizer's groups): a checkpoint of another model is named as such,
  // not as a shape error on its first tensor.
  for (const Stateful* part : parts.in_file_order()) part->check(file);
  for (Stateful* part : parts.in_load_order()) part->load(file);
}

}  // namespace kiln
