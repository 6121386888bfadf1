#include "train/run/fit_plan.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "train/loops/fit_loop.hpp"
#include "optim/optim.hpp"
#include "train/run/run_checkpoints.hpp"

namespace kiln {

FitSettings fit_settings(const Manifest& manifest, const RunSettings& run, bool resuming) {
  const auto& t = manifest.trainer;
  FitSettings settings;
  settings.training.spec = EpochSpec{run.shuffle, t.batch_size, run.limit_train};
  settings.training.accumulate_grad_batches = t.accumulate_grad_batches;
  settings.training.checkpoint_every_n_steps = run.checkpointing ? manifest.checkpoint.every_n_steps : 0;
  settings.val = EpochSpec{false, run.eval_batch_size, run.limit_val};
  settings.check_val_every_n_epoch = t.check_val_every_n_epoch;
  if (t.fast_dev_run == 0) settings.val_check_interval = t.val_check_interval;
  settings.test_after_fit = t.test_after_fit;
  settings.test = EpochSpec{false, run.eval_batch_size, run.limit_test};
  settings.checkpoint_every_n_epochs = run.checkpointing ? manifest.checkpoint.every_n_epochs : 0;
  // Overfitting validates on the very batches it trains on, at their size.
  if (run.overfit) settings.val = EpochSpec{false, t.batch_size, run.limit_val};
  settings.sanity_val_steps = resuming ? 0 : run.sanity_val_steps;
  return settings;
}

std::vector<ParamGroup> plan_optimizer_groups(const Manifest& manifest, TrainingState& state,
                                              const std::string& model_id) {
  std::vector<std::string> names;
  std::vector<bool> trained;
  for (const auto& [name, tensor] : state.params) {
    names.push_back(name);
    trained.push_back(tensor.requires_grad());
  }
  std::vector<ParamGroup> groups = plan_param_groups(manifest.optimizer, names, trained, model_id);
  state.optimizer_groups = describe_param_groups(groups, state.trainable_names);
  if (!manifest.optimizer.groups.empty())
    for (const ParamGroup& g : groups)
      spdlog::info("parameter group {}: {} tensors, lr {}", g.label, g.members.size(), g.options.lr);
  return groups;
}

LrSchedule lr_schedule(const Manifest& manifest, const RunSettings& run, const std::vector<ParamGroup>& groups,
                       int64_t train_batches) {
  const auto& t = manifest.trainer;
  const int64_t steps_per_epoch = (train_batches + t.accumulate_grad_batches - 1) / t.accumulate_grad_batches;
  const int64_t epochs = std::max<int64_t>(run.max_epochs, 1);
  const bool per_step = manifest.scheduler.interval == SchedulerInterval::step;
  const int64_t total_periods = per_step ? (run.max_steps > 0 ? run.max_steps : steps_per_epoch * epochs) : epochs;
  std::vector<double> base_lrs;
  for (const ParamGroup& g : groups) base_lrs.push_back(g.options.lr);
  return LrSchedule(manifest.scheduler, base_lrs, total_periods);
}

}  // namespace kiln
