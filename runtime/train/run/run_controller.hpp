// The run around the loops (RunControl): signals, the ranks' stop votes,
// checkpoint commits (every rank together), the preemption report, and
// metrics.csv's rows.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "ckpt/checkpoint_meta.hpp"
#include "loop_parts/loop_parts.hpp"
#include "train/run/run_metrics.hpp"
#include "train/run/run_settings.hpp"

namespace kiln {

class Checkpointer;
class EventFanOut;
class EpochCollections;
class Loggers;
class ProcessGroup;

class RunController final : public RunControl {
 public:
  // What a checkpoint at `position` holds (rank 0), with every rank's
  // unreduced metrics gathered already.
  // Brings the checkpoint's parts up to `position` (rank 0, in a commit);
  // returns the monitored value (RunCheckpoints::prepare).
  using Snapshot = std::function<std::optional<double>(const TrainPosition& position, RunMetrics::Unreduced unreduced)>;

  struct Parts {
    ProcessGroup* group;  // null in a single process
    Checkpointer& checkpointer;
    RunMetrics& metrics;
    EventFanOut& events;
    Loggers& loggers;
    EpochCollections* collections;  // the training split's rows go into mid-epoch checkpoints
  };
  RunController(const RunSettings& settings, Command command, const std::atomic<int>* signal, Parts parts,
                Snapshot snapshot);

  // Asked before each commit (every rank): false skips it (no file, no
  // retention change). trainer.detect_nonfinite's weight check.
  void guard_commits(std::function<bool(const TrainPosition&)> may_commit) { may_commit_ = std::move(may_commit); }

  void check_signal() override;
  Votes vote(const Votes& mine) override;
  void after_sanity_check() override;
  std::filesystem::path save_checkpoint(const TrainPosition& position) override;
  void finish_checkpoints() override;
  bool checkpointing() const override { return settings_.checkpointing; }
  [[noreturn]] void preempted(const TrainPosition& position) override;
  void log_row(const LogRow& row) override;

 private:
  int pending_signal() const { return signal_ ? signal_->load() : 0; }

  const RunSettings& settings_;
  Command command_;
  const std::atomic<int>* signal_;
  Parts parts_;
  Snapshot snapshot_;
  std::function<bool(const TrainPosition&)> may_commit_;
};

}  // namespace kiln
