#include "train/loops/fit_loop.hpp"

#include <chrono>

#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>

#include "optim/nonfinite_watch.hpp"
#include "optim/optim.hpp"
#include "optim/weight_averaging.hpp"
#include "util/activity.hpp"

namespace kiln {

FitLoop::FitLoop(LoopContext& context, const FitSettings& settings, Optimization optimization, StopCondition& stop)
    : context_(context),
      settings_(settings),
      optimization_(optimization),
      stop_(stop),
      policy_(context.control, stop, settings.training.checkpoint_every_n_steps, settings.checkpoint_every_n_epochs,
              context.profiler),
      epoch_loop_(context, settings.training, optimization, stop, policy_) {}

void FitLoop::run(const TrainPosition& start) {
  LoopContext& c = context_;
  const LrSchedule& schedule = optimization_.schedule;
  position_ = start;
  policy_.starting_at(start);
  c.global_step = start.global_step;
  if (optimization_.nonfinite) optimization_.nonfinite->start(start.global_step);
  if (c.activity) c.activity->at_step(c.global_step);
  schedule.apply(optimization_.optimizer, schedule.per_step() ? c.global_step : start.epoch);
  validates_ = c.model.has_step(KILN_SPLIT_VAL) && settings_.check_val_every_n_epoch > 0 &&
               c.data.length(KILN_SPLIT_VAL) > 0;
  if (c.profiler) c.profiler->begin_fit();
  c.notify(Event::fit_start, c.progress_at(KILN_STAGE_FIT, 0, -1));
  // Lightning's order: after on_fit_start, before the first training batch
  // and before max_time starts counting.
  if (validates_ && settings_.sanity_val_steps != 0) {
    ProfileScope timed(c.profiler, Phase::validation);
    EvaluationLoop(c, KILN_SPLIT_VAL, settings_.val, false).sanity_check(settings_.sanity_val_steps);
    c.control.after_sanity_check();
  }
  stop_.start_clock();
  const auto fit_started = std::chrono::steady_clock::now();
  int64_t epoch = start.epoch;
  while (!stop_.before_epoch(epoch, c.global_step)) {
    const bool stops = run_epoch(epoch, epoch == start.epoch ? first_sample(start) : 0);
    ++epoch;
    if (stops) break;
  }
  policy_.at_fit_end(position_);
  // A checkpoint still being written is durable before fit ends (and before
  // a test after fit, which may look for it).
  {
    ProfileScope timed(c.profiler, Phase::checkpoint);
    c.control.finish_checkpoints();
  }
  // Lightning's order: the averaged weights become the model's once training
  // ends (what a test after fit and the plugins' teardown see); the
  // checkpoints keep both.
  if (optimization_.averaging) {
    // A fit that ended before the average's first update has none: say so,
    // rather than let the trained weights pass for averaged ones.
    if (const std::string why = optimization_.averaging->never_updated(epoch - 1, c.global_step);
        !why.empty() && c.rank == 0)
      spdlog::warn("averaging: {}: the model keeps its trained weights", why);
    optimization_.averaging->copy_into_model();
  }
  // What bench/async_ckpt.sh reads: the loop's time, checkpoints included.
  spdlog::debug("fit: {} steps in {:.3f} s", c.global_step - start.global_step,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_started).count());
  c.notify(Event::fit_end, c.progress_at(KILN_STAGE_FIT, epoch, -1));
  if (c.profiler) c.profiler->end_fit();
  spdlog::info("fit done: {} epochs, {} steps ({})", epoch, c.global_step, stop_.describe());
  if (settings_.test_after_fit && c.model.has_step(KILN_SPLIT_TEST)) test_after_fit(epoch);
}

bool FitLoop::run_epoch(int64_t epoch, int64_t first_sample) {
  LoopContext& c = context_;
  c.notify(Event::train_epoch_start, c.progress_at(KILN_STAGE_FIT, epoch, -1));
  const auto started = std::chrono::steady_clock::now();
  const bool validating_epoch = validates_ && (epoch + 1) % settings_.check_val_every_n_epoch == 0;
  TrainingEpochLoop::MidEpochValidation mid_epoch{settings_.val_check_interval,
                                                  [this](int64_t e, int64_t b) { validate_mid_epoch(e, b); }};
  const auto result = epoch_loop_.run(epoch, first_sample, validating_epoch ? &mid_epoch : nullptr);
  // An epoch cut short (max_steps, a callback's stop, max_time) is committed
  // where it stopped, before its end is run: its metrics still unreduced and
  // its partial row not yet logged. A resumed run finishes the epoch and
  // runs its end once, as the uninterrupted run did, and the loggers, cut
  // back to the checkpoint, replace the partial row with the whole epoch's.
  const bool cut_short = result.next_batch < result.batches;
  if (cut_short) policy_.cut_short(TrainPosition{epoch, result.next_batch, c.global_step, result.next_sample});
  // SWA averages complete epochs (a resumed one completes in the resumed run).
  if (optimization_.averaging && result.next_batch >= result.batches) optimization_.averaging->after_epoch(epoch);
  // The epoch's collected rows, before its metrics are reduced: what
  // on_epoch_end logs is in the epoch's row.
  LogRow row{LogRow::Kind::epoch, epoch, 0, {}};
  {
    ProfileScope timed(c.profiler, Phase::logging);
    if (c.collector) c.collector->end_epoch(KILN_SPLIT_TRAIN, c.progress_at(KILN_STAGE_FIT, epoch, -1));
    // After the metrics are read back: on a GPU that copy waits for the
    // epoch's queued work, so the time is the device's, not the launches'.
    row.metrics = c.metrics.reduce();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (validating_epoch) {
    ProfileScope timed(c.profiler, Phase::validation);
    WeightAveraging::InModel averaged(optimization_.averaging);
    for (auto& [name, value] : EvaluationLoop(c, KILN_SPLIT_VAL, settings_.val, false).run(epoch))
      row.metrics[name] = value;
  }
  c.notify(Event::train_epoch_end, c.progress_at(KILN_STAGE_FIT, epoch, -1));
  spdlog::info("epoch {}{}{}  ({:.2f} s, {:.0f} samples/s)", epoch,
               c.max_epochs > 0 ? fmt::format("/{}", c.max_epochs - 1) : "", format_metrics(row.metrics), seconds,
               static_cast<double>(result.samples) / seconds);
  row.step = c.global_step;
  row.partial = cut_short;
  row.metrics["epoch_seconds"] = seconds;
  {
    ProfileScope timed(c.profiler, Phase::logging);
    c.control.log_row(row);
  }

  const LrSchedule& schedule = optimization_.schedule;
  if (!schedule.per_step()) schedule.apply(optimization_.optimizer, epoch + 1);
  // An epoch cut short resumes where it stopped.
  position_ = cut_short
                  ? TrainPosition{epoch, result.next_batch, c.global_step, result.next_sample}
                  : TrainPosition{epoch + 1, 0, c.global_step, 0};
  return policy_.after_epoch(epoch + 1, position_, result.stopped).has_value();
}

void FitLoop::test_after_fit(int64_t epochs) {
  LoopContext& c = context_;
  LogRow row{LogRow::Kind::epoch, epochs - 1, c.global_step,
             EvaluationLoop(c, KILN_SPLIT_TEST, settings_.test, false).run(epochs)};
  c.control.log_row(row);
}

// A position without a sample count (a checkpoint from an older kiln) was
// saved by a run like this one: its batches are this run's batches.
int64_t FitLoop::first_sample(const TrainPosition& start) const {
  if (start.next_sample >= 0) return start.next_sample;
  return start.next_batch * settings_.training.spec.batch_size * std::max<int64_t>(context_.world_size, 1);
}

void FitLoop::validate_mid_epoch(int64_t epoch, int64_t batch) {
  LoopContext& c = context_;
  ProfileScope timed(c.profiler, Phase::validation);
  c.metrics.set_aside();
  std::map<std::string, double> row;
  {
    WeightAveraging::InModel averaged(optimization_.averaging);
    row = EvaluationLoop(c, KILN_SPLIT_VAL, settings_.val, false).run(epoch);
  }
  c.metrics.take_back();
  spdlog::info("epoch {} batch {} (step {}){}", epoch, batch, c.global_step, format_metrics(row));
  c.control.log_row(LogRow{LogRow::Kind::epoch, epoch, c.global_step, std::move(row)});
}

}  // namespace kiln
