// `kiln fit`: epochs of the training epoch loop, validation every
// check_val_every_n_epoch epochs, epoch checkpoints, one metrics row per
// epoch, until the stop condition names its reason; then the test split if
// asked. Its position (the epoch) with the epoch loop's (the batch) is what a
// checkpoint saves.
#pragma once

#include "train/loops/checkpoint_policy.hpp"
#include "train/loops/evaluation_loop.hpp"
#include "loop_parts/loop_parts.hpp"
#include "train/loops/stop_condition.hpp"
#include "train/loops/training_epoch_loop.hpp"

namespace kiln {

struct FitSettings {
  TrainingSettings training;
  EpochSpec val;
  int64_t check_val_every_n_epoch = 1;  // 0: never
  BatchLimit val_check_interval;        // inside a validating epoch; 1.0: its end only
  bool test_after_fit = false;
  EpochSpec test;
  int64_t checkpoint_every_n_epochs = 0;  // 0: no epoch checkpoints
  int64_t sanity_val_steps = 0;           // validation batches before training; -1: all; 0: none
};

class FitLoop {
 public:
  FitLoop(LoopContext& context, const FitSettings& settings, Optimization optimization, StopCondition& stop);

  // Trains from `start` ({} for a fresh run; a checkpoint's position when
  // resumed). Returns when the stop condition holds.
  void run(const TrainPosition& start);

  // Where a resumed run would continue.
  TrainPosition position() const { return position_; }

 private:
  // One epoch: its training (and validations inside it), its row, then the
  // checkpoint policy and the stop condition. Whether the fit stops.
  bool run_epoch(int64_t epoch, int64_t first_sample);
  // A validation inside the epoch, after `batch`: its own metrics row.
  void validate_mid_epoch(int64_t epoch, int64_t batch);
  void test_after_fit(int64_t epochs);
  // Where in its epoch's sample order `start` continues.
  int64_t first_sample(const TrainPosition& start) const;

  LoopContext& context_;
  FitSettings settings_;
  Optimization optimization_;
  StopCondition& stop_;
  CheckpointPolicy policy_;
  TrainingEpochLoop epoch_loop_;
  TrainPosition position_;
  bool validates_ = false;  // the model validates and there is a val split
};

}  // namespace kiln
