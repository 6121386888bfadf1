// A run's checkpoints, in one place: the directory as earlier runs left it
// (one scan, checkpoint_dir), retention (top-k by the monitor, `last`), the
// commit protocol across ranks (rank 0 writes replicated state; every rank
// then learns in one collective whether the commit happened, and none goes on
// if it did not), and restore for resume.
//
// Asynchronous commits ([checkpoint] async, docs/checkpoints.md): commit()
// takes the snapshot on rank 0 and returns while a background thread writes
// it with the same protocol; at most one is in flight. Its outcome reaches
// every rank at the next commit (which waits for it first), at finish(), or
// at a step's vote (background_failed / raise_background_failure). With rank
// files, every rank writes its own in the background the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/background_commit.hpp"
#include "ckpt/checkpoint_dir.hpp"
#include "ckpt/retention.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/checkpoint_parts.hpp"
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

  // What a checkpoint holds: every component registers its part here
  // (ckpt/checkpoint_parts.hpp).
  CheckpointParts& parts() { return parts_; }

  // Commits a checkpoint at `position` on every rank together, of the
  // registered parts. `prepare` is called on rank 0 only, before the parts
  // are saved, to bring what they export up to `position`; it returns the
  // monitored value retention ranks the checkpoint by (none: nullopt).
  // Returns the file committed (asynchronous: being written), on every
  // rank; throws on every rank when the commit failed, or the one before it
  // in the background (rank 0 with the cause; the others with PeerFailure).
  using Prepare = std::function<std::optional<double>(const TrainPosition&)>;
  // A collective every rank runs at the start of each commit, before rank 0
  // saves the parts: a part that needs every rank's share (the sharded
  // optimizer's state) gathers it here.
  void before_each_commit(std::function<void()> gather) { gathers_.push_back(std::move(gather)); }
  // Runs on every rank once a commit is over (written, or in the
  // background from its snapshot), whether it succeeded or not.
  void after_each_commit(std::function<void()> release) { releases_.push_back(std::move(release)); }
  std::filesystem::path commit(const TrainPosition& position, const Prepare& prepare);

  // On every rank together: waits until no commit is in flight; throws as
  // commit() does when the one in flight failed. A no-op when synchronous.
  void finish();
  // The file the newest commit() wrote (asynchronous: once finish() has
  // returned, durable); empty before the first.
  const std::filesystem::path& last_committed() const { return last_committed_; }

  // Rank 0, without waiting: whether the commit in flight has failed (its
  // cause is kept for raise_background_failure). False on other ranks.
  bool background_failed();
  // On every rank, once a vote said some rank's background commit failed.
  [[noreturn]] void raise_background_failure();

  // Every rank writes a file of its own beside each checkpoint
  // (ckpt/rank_files.hpp) from the parts registered in rank_parts(): called
  // on every rank, with the world size, how long rank 0 waits for the
  // others' files, and a collective that returns a number rank 0 chose,
  // the same on every rank (the commit's nonce).
  struct RankFilesSetup {
    int world = 1;
    std::chrono::milliseconds timeout{0};
    std::function<uint64_t()> agree_nonce;
  };
  void write_rank_files(RankFilesSetup setup) { rank_files_ = std::move(setup); }
  CheckpointParts& rank_parts() { return rank_parts_; }
  // What the next checkpoint's meta says of its rank files (MetaPart).
  const RankFilesTag& rank_files_tag() const { return rank_files_tag_; }

  // Restores `file` into the registered parts (after every part checked
  // that it fits). Throws CheckpointError naming the file and the first
  // mismatch.
  void restore(const std::filesystem::path& file) const;


 private:
  RetentionPolicy policy() const;
  // The file a commit at `position` writes.
  std::filesystem::path file_for(const TrainPosition& position) const;
  // Rank 0's part of a commit: writes the snapshot (and the last link), then
  // prunes. On the commit thread when asynchronous.
  // `mine`: rank 0's rank file, written first; then it waits for the others'.
  void write(const std::filesystem::path& file, const TrainPosition& position, std::optional<double> monitored,
             const CheckpointSnapshot& snapshot, const CheckpointSnapshot* mine);
  // Every rank learns whether every rank's part (`error`, "" if none)
  // succeeded; throws on every rank if not (with its own cause, if any).
  void agree(const std::string& error);
  // This rank's file of the commit being made (every rank, rank files only).
  void write_rank_file(const std::filesystem::path& file, const CheckpointSnapshot& snapshot);

  const CheckpointConfig& config_;
  int rank_;
  AllSucceeded all_succeeded_;
  CheckpointParts parts_;
  CheckpointParts rank_parts_;
  std::optional<RankFilesSetup> rank_files_;
  RankFilesTag rank_files_tag_;
  std::vector<std::function<void()>> gathers_;
  std::vector<std::function<void()>> releases_;
  std::filesystem::path last_committed_;
  CheckpointDirectory directory_;
  std::string background_error_;  // rank 0: a failure background_failed() saw
  SnapshotBuffers snapshot_buffers_;  // rank 0, asynchronous: kept between snapshots
  SnapshotBuffers rank_snapshot_buffers_;  // every rank, rank files, asynchronous
  // Last: destroyed first, so a commit in flight ends before what it uses.
  BackgroundCommit background_;
};

}  // namespace kiln
