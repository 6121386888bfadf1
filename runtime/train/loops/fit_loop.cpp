#include "train/loops/fit_loop.hpp"

#include <chrono>

#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>

#include "train/optim.hpp"

namespace kiln {

FitLoop::FitLoop(LoopContext& context, const FitSettings& settings, Optimization optimization, StopCondition& stop)
    : context_(context),
      settings_(settings),
      optimization_(optimization),
      stop_(stop),
      epoch_loop_(context, settings.training, optimization, stop) {}

void FitLoop::run(const TrainPosition& start) {
  LoopContext& c = context_;
  const LrSchedule& schedule = optimization_.schedule;
  position_ = start;
  c.global_step = start.global_step;
  schedule.apply(optimization_.optimizer, schedule.per_step() ? c.global_step : start.epoch);
  const bool validates = c.model.has_step(KILN_SPLIT_VAL) && settings_.check_val_every_n_epoch > 0 &&
                         c.data.length(KILN_SPLIT_VAL) > 0;
  c.events.notify(Event::fit_start, c.progress_at(KILN_STAGE_FIT, 0, -1));
  stop_.start_clock();
  TrainingEpochLoop::MidEpochValidation mid_epoch{settings_.val_check_interval,
                                                  [this](int64_t e, int64_t b) { validate_mid_epoch(e, b); }};

  int64_t epoch = start.epoch;
  while (!stop_.before_epoch(epoch)) {
    c.events.notify(Event::train_epoch_start, c.progress_at(KILN_STAGE_FIT, epoch, -1));
    const auto started = std::chrono::steady_clock::now();
    const bool validating_epoch = validates && (epoch + 1) % settings_.check_val_every_n_epoch == 0;
    const auto result =
        epoch_loop_.run(epoch, epoch == start.epoch ? first_sample(start) : 0, validating_epoch ? &mid_epoch : nullptr);
    // After the metrics are read back: on a GPU that copy waits for the
    // epoch's queued work, so the time is the device's, not the launches'.
    std::map<std::string, double> row = c.metrics.reduce();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (validating_epoch)
      for (auto& [name, value] : EvaluationLoop(c, KILN_SPLIT_VAL, settings_.val, false).run(epoch)) row[name] = value;
    c.events.notify(Event::train_epoch_end, c.progress_at(KILN_STAGE_FIT, epoch, -1));
    spdlog::info("epoch {}{}{}  ({:.2f} s, {:.0f} samples/s)", epoch,
                 c.max_epochs > 0 ? fmt::format("/{}", c.max_epochs - 1) : "", format_metrics(row), seconds,
                 static_cast<double>(result.samples) / seconds);
    row["epoch"] = static_cast<double>(epoch);
    row["step"] = static_cast<double>(c.global_step);
    row["epoch_seconds"] = seconds;
    c.control.log_row(row);

    if (!schedule.per_step()) schedule.apply(optimization_.optimizer, epoch + 1);
    // An epoch cut short (max_steps, a stop) resumes where it stopped.
    position_ = result.next_batch < result.batches
                    ? TrainPosition{epoch, result.next_batch, c.global_step, result.next_sample}
                    : TrainPosition{epoch + 1, 0, c.global_step, 0};
    // Epoch checkpoints are for complete epochs; a cut-short epoch is covered
    // by the step policy (or a preemption), whose checkpoint also carries the
    // epoch's partial metrics, so a resumed epoch reports exactly.
    bool saved = false;
    if (settings_.checkpoint_every_n_epochs > 0 && position_.next_batch == 0 &&
        (epoch + 1) % settings_.checkpoint_every_n_epochs == 0) {
      c.control.save_checkpoint(position_);
      saved = true;
    }
    ++epoch;
    const auto stop = stop_.after_epoch(c.control, epoch, c.global_step);
    if (stop == StopReason::preempted) c.control.preempted(position_);
    // Out of time at the epoch's end (a stop inside it saved there).
    if (stop == StopReason::max_time && !result.stopped && !saved && c.control.checkpointing())
      c.control.save_checkpoint(position_);
    if (stop) break;
  }
  c.events.notify(Event::fit_end, c.progress_at(KILN_STAGE_FIT, epoch, -1));
  spdlog::info("fit done: {} epochs, {} steps ({})", epoch, c.global_step, stop_.describe());

  if (settings_.test_after_fit && c.model.has_step(KILN_SPLIT_TEST)) {
    auto metrics = EvaluationLoop(c, KILN_SPLIT_TEST, settings_.test, false).run(epoch);
    metrics["epoch"] = static_cast<double>(epoch - 1);
    metrics["step"] = static_cast<double>(c.global_step);
    c.control.log_row(metrics);
  }
}

// A position without a sample count (a checkpoint from an older kiln) was
// saved by a run like this one: its batches are this run's batches.
int64_t FitLoop::first_sample(const TrainPosition& start) const {
  if (start.next_sample >= 0) return start.next_sample;
  return start.next_batch * settings_.training.spec.batch_size * std::max<int64_t>(context_.world_size, 1);
}

void FitLoop::validate_mid_epoch(int64_t epoch, int64_t batch) {
  LoopContext& c = context_;
  c.metrics.set_aside();
  std::map<std::string, double> row = EvaluationLoop(c, KILN_SPLIT_VAL, settings_.val, false).run(epoch);
  c.metrics.take_back();
  spdlog::info("epoch {} batch {} (step {}){}", epoch, batch, c.global_step, format_metrics(row));
  row["epoch"] = static_cast<double>(epoch);
  row["step"] = static_cast<double>(c.global_step);
  c.control.log_row(row);
}

}  // namespace kiln
