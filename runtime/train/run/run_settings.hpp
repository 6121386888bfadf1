// What a run's manifest and command decide before anything starts: its
// limits (with fast_dev_run applied), whether it writes checkpoints, which
// signal preempts it, how often its ranks vote.
#pragma once

#include <cstdint>
#include <optional>

#include "config/manifest.hpp"
#include "train/command.hpp"

namespace kiln {

struct RunSettings {
  int64_t max_epochs = 1;
  int64_t max_steps = -1;
  BatchLimit limit_train, limit_val, limit_test;
  bool shuffle = true;
  // trainer.overfit_batches: validation reads the training split's first
  // batches, the ones training runs, unshuffled.
  bool overfit = false;
  // Validation batches before the first training step (0: none; -1: all).
  int64_t sanity_val_steps = 0;
  std::optional<int64_t> max_seconds;  // trainer.max_time
  int64_t eval_batch_size = 1;
  bool checkpointing = false;
  int preempt_signal = 0;  // 0: no signal preempts this run
  // Steps between the ranks' stop votes (1 in one process).
  int64_t vote_every_n_steps = 1;

  static RunSettings of(const Manifest& manifest, Command command, bool distributed);
};

// "SIGINT", "SIGTERM" or "SIGUSR1".
const char* signal_name(int signal);

}  // namespace kiln
