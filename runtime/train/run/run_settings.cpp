#include "train/run/run_settings.hpp"

#include <csignal>

#include "config/duration.hpp"

namespace kiln {

namespace {

// How often ranks vote on stopping (a callback's request, a signal, a
// preemption) inside an epoch. Each vote is a collective round trip; voting
// every step cost mlp256 ~25 % of its 2-process epoch on this machine, and a
// stop acted on 16 steps later is still prompt (bench/README.md).
constexpr int64_t kAgreeEveryNSteps = 16;

}  // namespace

const char* signal_name(int s) { return s == SIGTERM ? "SIGTERM" : s == SIGUSR1 ? "SIGUSR1" : "SIGINT"; }

RunSettings RunSettings::of(const Manifest& m, Command command, bool distributed) {
  const auto& t = m.trainer;
  RunSettings s;
  s.max_epochs = t.max_epochs;
  s.max_steps = t.max_steps;
  s.limit_train = t.limit_train_batches;
  s.limit_val = t.limit_val_batches;
  s.limit_test = t.limit_test_batches;
  s.shuffle = t.shuffle;
  s.sanity_val_steps = t.num_sanity_val_steps;
  const BatchLimit& overfit = t.overfit_batches;
  if (overfit.is_fraction ? overfit.fraction > 0.0 : overfit.count > 0) {
    // Lightning's overfit_batches: the same batches, in the same order, for
    // training and validation (the manifest refused limits beside it).
    s.overfit = true;
    s.shuffle = false;
    s.limit_train = s.limit_val = overfit;
  }
  if (t.fast_dev_run > 0) {
    // Lightning's fast_dev_run: N batches of each split, one epoch.
    s.max_epochs = 1;
    s.max_steps = -1;
    BatchLimit n;
    n.is_fraction = false;
    n.count = t.fast_dev_run;
    s.limit_train = s.limit_val = s.limit_test = n;
    s.sanity_val_steps = 0;  // Lightning's fast_dev_run skips it too: the run validates at once
  }
  if (!t.max_time.empty() && t.fast_dev_run == 0) s.max_seconds = parse_duration_seconds(t.max_time);
  s.eval_batch_size = t.eval_batch_size > 0 ? t.eval_batch_size : t.batch_size;
  // Lightning's fast_dev_run writes no checkpoints either.
  s.checkpointing = m.checkpoint.enabled && command == Command::fit && t.fast_dev_run == 0;
  // Preempted means a checkpoint, then exit 75: only a run that writes
  // checkpoints can be; elsewhere the signal interrupts (exit 130).
  if (s.checkpointing && m.checkpoint.preempt_signal != PreemptSignal::none)
    s.preempt_signal = m.checkpoint.preempt_signal == PreemptSignal::sigusr1 ? SIGUSR1 : SIGTERM;
  s.vote_every_n_steps = distributed ? kAgreeEveryNSteps : 1;
  return s;
}

}  // namespace kiln
