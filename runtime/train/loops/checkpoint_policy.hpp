// When a fit saves a checkpoint, for both loops, in one order: on the
// schedule (every n steps; every n complete epochs), then the ranks' stop
// vote; a preemption commits one and ends the run; a run out of time
// commits one where it stops (unless the schedule just did), so that
// `--resume last` continues exactly there; and a fit that ends anywhere
// else the schedule did not just save commits one there.
#pragma once

#include <cstdint>
#include <optional>

#include "loop_parts/loop_parts.hpp"
#include "train/loops/stop_condition.hpp"

namespace kiln {

class CheckpointPolicy {
 public:
  // 0: no checkpoints on that schedule.
  CheckpointPolicy(RunControl& control, StopCondition& stop, int64_t every_n_steps, int64_t every_n_epochs,
                   Profiler* profiler = nullptr)
      : control_(control),
        stop_(stop),
        every_n_steps_(every_n_steps),
        every_n_epochs_(every_n_epochs),
        profiler_(profiler) {}

  // After an optimizer step; `here` is where a resumed run would continue.
  std::optional<StopReason> after_step(const TrainPosition& here);
  // After an epoch (`epochs_done` complete); `next` is where the run
  // continues, `cut_short` whether a stop ended the epoch early (that stop
  // saved already, where the epoch stopped).
  std::optional<StopReason> after_epoch(int64_t epochs_done, const TrainPosition& next, bool cut_short);
  // A stop ended the epoch at `here`, before its last batch, and its end
  // (reduced metrics, the partial row, validation, callbacks) is still to
  // run: unless a checkpoint was just committed at this step, one is, so
  // that it holds the epoch's unreduced metrics and the loggers' files
  // without the partial row.
  void cut_short(const TrainPosition& here);
  // Where the fit starts: a resumed run's position is committed already.
  void starting_at(const TrainPosition& start) { saved_step_ = start.global_step; }
  // The fit ended at `end`, for whatever reason: unless a checkpoint was
  // just committed there, one is (Lightning's last.ckpt at the final epoch
  // end, cut short or not), so the final weights are never lost and
  // `--resume last` with a larger max_steps or max_epochs goes on from them.
  void at_fit_end(const TrainPosition& end);

 private:
  std::optional<StopReason> settle(std::optional<StopReason> stop, const TrainPosition& at, bool saved);
  void save(const TrainPosition& at);

  RunControl& control_;
  StopCondition& stop_;
  int64_t every_n_steps_, every_n_epochs_;
  Profiler* profiler_;
  int64_t saved_step_ = -1;  // the global step of the newest commit
};

}  // namespace kiln
