// A run's checkpoints, in one place: the directory as earlier runs left it
// (one scan, checkpoint_dir), retention (top-k by the monitor, `last`), the
// commit protocol across ranks (rank 0 writes replicated state; every rank
// then learns in one collective whether the commit happened, and none goes on
// if it did not), and restore for resume.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.hpp"
#include "ckpt/retention.hpp"
#include "ckpt/run_state.hpp"
#include "config/manifest.hpp"

namespace kiln {

class Checkpointer {
 public:
  // Every rank passes whether its part of a commit succeeded; true when all
  // did. In a single process: the identity.
  using AllSucceeded = std::function<bool(bool ok)>;

  Checkpointer(const CheckpointConfig& config, int rank, AllSucceeded all_succeeded);

  // Rank 0, once the run may write: creates the directory, removes what an
  // interrupted write left, and ranks the checkpoints earlier runs committed
  // (so that retention may prune them).
  void open();

  // Commits a checkpoint at `position` on every rank together. `state` is
  // called on rank 0 only, to build what is saved. Returns the file
  // committed, on every rank (rank 0 wrote it); throws on every rank when the commit failed (rank 0 with the
  // cause; the others with PeerFailure).
  std::filesystem::path commit(const TrainPosition& position,
                               const std::function<RunStateView(const TrainPosition&)>& state);

  // Restores `file` into `view` (after checking it fits). Returns the resume
  // point in one line: name, size and position, for the start-up agreement.
  static std::string restore(const std::filesystem::path& file, RunStateView& view);

  const std::vector<CheckpointInfo>& ranked() const { return directory_.ranked(); }

 private:
  RetentionPolicy policy() const;
  // Rank 0's part of commit(): writes the file (and the last link), then
  // prunes. Returns the file written.
  std::filesystem::path write(const TrainPosition& position,
                              const std::function<RunStateView(const TrainPosition&)>& state);

  const CheckpointConfig& config_;
  int rank_;
  AllSucceeded all_succeeded_;
  CheckpointDirectory directory_;
};

}  // namespace kiln
