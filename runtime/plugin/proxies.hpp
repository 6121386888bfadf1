// Typed faces of the created plugins: the loops call these, never a
// kiln_*_hooks table, and never check a hook's result by hand. Each call is
// marked for the heartbeat (util/activity) and turns a plugin's error into a
// HookError naming plugin and hook.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/named_tensors.hpp"
#include "plugin/plugin_instance.hpp"
#include "loop_parts/loop_parts.hpp"

namespace kiln {

class Activity;

class ModelProxy final : public StepModel {
 public:
  ModelProxy(PluginInstance& model, Activity* activity) : model_(model), activity_(activity) {}

  bool has_step(kiln_split split) const override;
  at::Tensor training_step(kiln_batch& batch, int64_t batch_index) override;
  void evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) override;
  at::Tensor predict_step(kiln_batch& batch, int64_t batch_index) override;
  // ABI 1.2: the end of an epoch of `split`, with every rank's collected rows.
  bool has_epoch_end() const { return model_.plugin().model_on_epoch_end() != nullptr; }
  void on_epoch_end(kiln_split split, const kiln_batch& collected);
  // ABI 1.5: the model looks at a sample of `split`'s batches before
  // anything runs; its refusal is bad input (exit 2).
  bool has_check_batch() const { return model_.plugin().model_check_batch() != nullptr; }
  void check_batch(kiln_split split, const kiln_batch& sample);

  // The model's parameters and buffers, as it reports them.
  struct Tensors {
    NamedTensors params, buffers;
  };
  Tensors parameters();

  const std::string& id() const { return model_.id(); }

 private:
  PluginInstance& model_;
  Activity* activity_;
};

class DataModuleProxy {
 public:
  // `activity` (may be null) is told when the main thread calls get_batch
  // itself (trainer.data_workers = 0).
  explicit DataModuleProxy(PluginInstance& data, Activity* activity = nullptr) : data_(data), activity_(activity) {}
  int64_t length(kiln_split split);
  [[noreturn]] void refuse(const std::string& hook, const std::string& message) const;
  PluginInstance& instance() { return data_; }
  Activity* activity() const { return activity_; }

 private:
  PluginInstance& data_;
  Activity* activity_;
};

class CallbackSet final : public EventSink {
 public:
  CallbackSet(const std::vector<std::unique_ptr<PluginInstance>>& callbacks, Activity* activity);
  void notify(Event event, const kiln_progress& progress) override;
  // ABI 1.2: on_epoch_collected, in manifest order.
  bool wants_collections() const { return !collected_.empty(); }
  void epoch_collected(const kiln_progress& progress, kiln_split split, const kiln_batch& collected);

 private:
  struct Hooked {
    PluginInstance* callback;
    kiln_callback_hook hook;
  };
  // Per event, the callbacks that implement its hook, in manifest order,
  // found once: an event no callback implements (on_train_batch_end, every
  // step, usually) costs a look at an empty list.
  std::array<std::vector<Hooked>, static_cast<size_t>(Event::fit_end) + 1> hooked_;
  std::vector<PluginInstance*> collected_;  // callbacks with on_epoch_collected
  Activity* activity_;
};

// A plugin's own state (state_save / state_load), for checkpoints.
std::map<std::string, std::string> save_plugin_state(const PluginInstance& plugin);
void load_plugin_state(const PluginInstance& plugin, const std::map<std::string, std::string>& blobs);

}  // namespace kiln
