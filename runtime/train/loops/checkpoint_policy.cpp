#include "train/loops/checkpoint_policy.hpp"

namespace kiln {

std::optional<StopReason> CheckpointPolicy::after_step(const TrainPosition& here) {
  const bool scheduled = every_n_steps_ > 0 && here.global_step % every_n_steps_ == 0;
  if (scheduled) save(here);
  return settle(stop_.after_step(control_, here.global_step), here, scheduled);
}

// Epoch checkpoints are for complete epochs; a cut-short epoch is covered by
// the step schedule or by the stop's own checkpoint, which also carries the
// epoch's unreduced metrics, so a resumed epoch reports exactly.
std::optional<StopReason> CheckpointPolicy::after_epoch(int64_t epochs_done, const TrainPosition& next,
                                                        bool cut_short) {
  const bool scheduled = every_n_epochs_ > 0 && next.next_batch == 0 && epochs_done % every_n_epochs_ == 0;
  if (scheduled) save(next);
  return settle(stop_.after_epoch(control_, epochs_done, next.global_step), next, scheduled || cut_short);
}

std::optional<StopReason> CheckpointPolicy::settle(std::optional<StopReason> stop, const TrainPosition& at,
                                                   bool saved) {
  if (stop == StopReason::preempted) control_.preempted(at);
  // Out of time: the run can go on from here with --resume last.
  if (stop == StopReason::max_time && !saved && control_.checkpointing()) save(at);
  return stop;
}

void CheckpointPolicy::cut_short(const TrainPosition& here) {
  if (control_.checkpointing() && here.global_step != saved_step_) save(here);
}

void CheckpointPolicy::at_fit_end(const TrainPosition& end) {
  if (control_.checkpointing() && end.global_step != saved_step_) save(end);
}

void CheckpointPolicy::save(const TrainPosition& at) {
  ProfileScope timed(profiler_, Phase::checkpoint);
  control_.save_checkpoint(at);
  saved_step_ = at.global_step;
}

}  // namespace kiln
