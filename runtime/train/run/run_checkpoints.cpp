#include "train/run/run_checkpoints.hpp"

#include <random>

#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>

#include "ckpt/checkpointer.hpp"
#include "distributed/process_group.hpp"
#include "train/run/epoch_collections.hpp"
#include "plugin/proxies.hpp"
#include "data/sampled_batches.hpp"
#include "data/sampler.hpp"
#include "util/errors.hpp"

namespace kiln {

RunCheckpoints::RunCheckpoints(const Manifest& manifest, const RunSettings& settings, int32_t rank, int32_t world_size,
                               c10::Device device, Parts parts)
    : m_(manifest),
      settings_(settings),
      rank_(rank),
      world_size_(world_size),
      device_(device),
      parts_(std::move(parts)),
      meta_part_({position_, saved_by_, m_.checkpoint.monitor, monitored_, m_.text,
                  &parts_.checkpointer.rank_files_tag()}),
      params_part_("param/", "parameter", parts_.state.params),
      buffers_part_("buffer/", "buffer", parts_.state.buffers),
      rng_part_(device),
      plugins_part_(plugin_states_),
      metrics_part_(metrics_sections_, saved_by_),
      scaler_part_(parts_.state.scaler) {
  CheckpointParts& registry = parts_.checkpointer.parts();
  registry.add("meta", meta_part_, load_priority::position);
  registry.add("param", params_part_, load_priority::model);
  registry.add("buffer", buffers_part_, load_priority::model);
  registry.add("rng", rng_part_, load_priority::model);
  registry.add("plugin", plugins_part_, load_priority::run);
  // A checkpoint without a scaler restores nothing into it (it starts afresh).
  if (m_.trainer.precision == Precision::fp16_mixed) registry.add("scaler", scaler_part_, load_priority::run);
  registry.add("metrics", metrics_part_, load_priority::run);
}

void RunCheckpoints::register_optimizer(const std::vector<at::Tensor>* masters) {
  TrainingState& s = parts_.state;
  if (masters)
    optimizer_part_.emplace(*s.optimizer, masters, s.optimizer_groups, &s.trainable);
  else
    optimizer_part_.emplace(*s.optimizer, &s.trainable, s.optimizer_groups);
  parts_.checkpointer.parts().replace("optim", *optimizer_part_, load_priority::model);
}

void RunCheckpoints::register_sharded_optimizer(const std::vector<at::Tensor>& owned, const ShardLayout& layout,
                                                ProcessGroup* group, bool masters) {
  TrainingState& s = parts_.state;
  sharded_optimizer_part_.emplace(*s.optimizer, owned, s.trainable, layout, group, s.optimizer_groups, masters);
  parts_.checkpointer.parts().replace("optim", *sharded_optimizer_part_, load_priority::model);
  if (group && group->world_size() > 1 && group->one_host()) {
    // Each rank writes its own share, in parallel, beside rank 0's file
    // (ckpt/rank_files.hpp): nothing is gathered. Across hosts the run
    // directory need not be shared, so rank 0 gathers the state instead.
    sharded_optimizer_part_->write_rank_files();
    parts_.checkpointer.rank_parts().add("optim", sharded_optimizer_part_->rank_part(), load_priority::model);
    parts_.checkpointer.write_rank_files(Checkpointer::RankFilesSetup{group->world_size(), group->timeout(), [group] {
      // Rank 0's random number, the same on every rank: each commit's rank
      // files get names no earlier commit used.
      at::Tensor nonce = at::zeros({1}, at::kLong);
      if (group->rank() == 0) {
        std::random_device random;
        nonce[0] = static_cast<int64_t>(((uint64_t{random()} << 32) | random()) >> 1);
      }
      std::vector<at::Tensor> one{nonce};
      group->broadcast(one, 0);
      return static_cast<uint64_t>(nonce[0].item<int64_t>());
    }});
    return;
  }
  parts_.checkpointer.before_each_commit([this] { sharded_optimizer_part_->gather(); });
}

void RunCheckpoints::hold_whole_weights_while_committing(std::function<void()> gather, std::function<void()> release) {
  parts_.checkpointer.before_each_commit(std::move(gather));
  parts_.checkpointer.after_each_commit(std::move(release));
}

std::optional<double> RunCheckpoints::prepare(const TrainPosition& position, RunMetrics::Unreduced unreduced) {
  position_ = position;
  saved_by_ = SavedBy{world_size_, m_.trainer.batch_size};
  monitored_ = m_.checkpoint.monitor.empty() ? std::nullopt : parts_.metrics.latest(m_.checkpoint.monitor);
  metrics_sections_.latest = parts_.metrics.export_latest();
  metrics_sections_.pending = RunMetrics::pending_for_older_kilns(unreduced);
  metrics_sections_.state = std::move(unreduced.stores);
  metrics_sections_.tensor_state = std::move(unreduced.tensors);
  metrics_sections_.collected = std::move(unreduced.collected);
  plugin_states_.clear();
  for (const PluginInstance* p : parts_.plugins()) plugin_states_[p->id()] = save_plugin_state(*p);
  return monitored_;
}

TrainPosition RunCheckpoints::resume(const std::filesystem::path& file, Command command) {
  position_ = TrainPosition{};
  saved_by_ = SavedBy{};
  monitored_.reset();
  plugin_states_.clear();
  metrics_sections_ = MetricsSections{};
  parts_.checkpointer.restore(file);
  spdlog::info("resumed from {}: epoch {}, batch {}, step {}", file.string(), position_.epoch, position_.next_batch,
               position_.global_step);
  std::error_code ec;
  resume_point_ = fmt::format("{} ({} bytes): epoch {}, batch {}, step {}", file.filename().string(),
                              std::filesystem::file_size(file, ec), position_.epoch, position_.next_batch,
                              position_.global_step);
  if (command == Command::fit) check_continuation(file, position_, saved_by_);
  // Only a resumed fit continues the checkpoint's epoch and its files;
  // validate / test / predict evaluate its weights into files of their own
  // (docs/logging.md), with its metrics' latest values for metric_get.
  const bool fit = command == Command::fit;
  try {
    parts_.metrics.restore(metrics_sections_.latest, fit ? metrics_sections_.pending : "",
                           fit ? RunMetrics::Unreduced{metrics_sections_.state, metrics_sections_.tensor_state, {}}
                               : RunMetrics::Unreduced{},
                           rank_, world_size_, device_);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(file.string() + ": its metrics cannot be read (" + e.what() + ")");
  }
  // The interrupted training epoch's collected rows.
  if (fit && parts_.collections) {
    try {
      parts_.collections->restore(metrics_sections_.collected, rank_);
    } catch (const std::invalid_argument& e) {
      throw CheckpointError(file.string() + ": its collected rows cannot be read (" + e.what() + ")");
    }
  }
  for (const PluginInstance* p : parts_.plugins()) {
    auto it = plugin_states_.find(p->id());
    if (it != plugin_states_.end()) load_plugin_state(*p, it->second);
  }
  return position_;
}

// A checkpoint taken inside an epoch by a run of another world size or
// batch size continues from the sample it reached (data/sampler.hpp), or
// is refused here, before anything is written, where that cannot be exact.
void RunCheckpoints::check_continuation(const std::filesystem::path& file, const TrainPosition& position,
                                        const SavedBy& saved) {
  const int64_t world = world_size_, batch = m_.trainer.batch_size;
  if (saved.world_size <= 0 || saved.batch_size <= 0) return;  // an older kiln's: taken as this run's shape
  if (saved.world_size == world && saved.batch_size == batch) return;
  const std::string was = fmt::format("{} process{} with batch size {}", saved.world_size,
                                      saved.world_size == 1 ? "" : "es", saved.batch_size);
  const std::string now = fmt::format("{} process{} with batch size {}", world, world == 1 ? "" : "es", batch);
  const int64_t steps = steps_per_epoch(world, batch), saved_steps = steps_per_epoch(saved.world_size, saved.batch_size);
  if (position.next_batch == 0) {
    spdlog::info("resume: the checkpoint was saved by {}, this run has {}: from epoch {} on, an epoch has {} "
                 "optimizer steps instead of {}",
                 was, now, position.epoch, steps, saved_steps);
    return;
  }
  const std::string inside = file.string() + ": saved inside epoch " + std::to_string(position.epoch);
  if (position.next_sample < 0) throw CheckpointError(inside + " without its sample position; resume it with " + was);
  if (!settings_.limit_train.is_fraction || settings_.limit_train.fraction < 1.0)
    throw CheckpointError(inside + " by " + was + "; with trainer.limit_train_batches the epoch cannot be continued "
                          "exactly by " + now + " (resume with " + was + ", or from a checkpoint at an epoch's end)");
  const int64_t accumulate = m_.trainer.accumulate_grad_batches;
  if (accumulate > 1 && position.next_sample % (batch * world * accumulate) != 0)
    throw CheckpointError(fmt::format(
        "{} after {} samples by {}; with accumulate_grad_batches = {}, {} would straddle an optimizer step there "
        "(resume with {}, or from a checkpoint at an epoch's end)",
        inside, position.next_sample, was, accumulate, now, was));
  parts_.batches.continue_epoch_saved_elsewhere(position.epoch);
  spdlog::info("resume: the checkpoint was saved by {} inside epoch {}, this run has {}: it continues from sample "
               "{} of the epoch's order, each of its samples trained once; an epoch has {} optimizer steps instead of "
               "{}, so step-counted settings (max_steps, every_n_steps, per-step schedules) fall at other samples",
               was, position.epoch, now, position.next_sample, steps, saved_steps);
}

int64_t RunCheckpoints::steps_per_epoch(int64_t world, int64_t batch) const {
  SamplerOptions options;
  options.batch_size = batch;
  options.world_size = world;
  options.drop_last = m_.trainer.drop_last;
  const int64_t batches = settings_.limit_train.apply(batches_in_shard(options, parts_.batches.length(KILN_SPLIT_TRAIN)));
  return (batches + m_.trainer.accumulate_grad_batches - 1) / m_.trainer.accumulate_grad_batches;
}

}  // namespace kiln
