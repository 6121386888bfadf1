// A run's checkpoint directory, every concern of it in one place: the one
// scan (used to rank what earlier runs left and to answer `--resume
// last|best`), the sweep of temporaries an interrupted write left, applying
// retention (the decisions themselves: retention.hpp), and the `last` link.
// No LibTorch here.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/retention.hpp"

namespace kiln {

// Every committed checkpoint (*.ckpt, not a hidden temporary) in `dir` whose
// header, metadata and trailer read back (read_checkpoint_head: a few hundred
// bytes per file, never its tensor data, so a run's start-up does not grow
// with the size or the number of checkpoints kept); one that does not is
// passed to `skipped` and left out. The checksum is verified only for the
// file a run then uses (resolve_resume, restore). A missing directory holds
// none.
std::vector<CheckpointInfo> scan_checkpoints(const std::filesystem::path& dir,
                                             const std::function<void(const CheckpointError&)>& skipped);

// Only the ranked ones ("epoch=...-step=....ckpt"), as retention counts them.
std::vector<CheckpointInfo> ranked_only(std::vector<CheckpointInfo> all);

// `--resume PATH|last|best` to one valid checkpoint file, checksum verified.
// "last" and "best" search `dir`, skipping (with a warning) files that fail
// validation, and verify the whole of only the file they choose (then the
// next choice, if that one fails); an explicit path that fails validation is
// an InputError naming the problem. `option` is the flag that named it, as
// messages say it (fit's --resume, an evaluation's --ckpt).
std::filesystem::path resolve_resume(const std::string& spec, const std::filesystem::path& dir,
                                     const RetentionPolicy& policy, const std::string& option = "--resume");

// `--resume auto`, and what a restart resumes from: the checkpoint `last`
// resolves to when `dir` holds a valid one (checksum verified), nullopt when
// it holds none (a fresh start). Checkpoints that all fail validation are an
// InputError, not "none".
std::optional<CheckpointInfo> newest_checkpoint(const std::filesystem::path& dir, const RetentionPolicy& policy);

// Publishes a committed checkpoint under a second name (last.ckpt): atomic,
// durable, and no second copy of the bytes (util/durable_file).
void link_checkpoint(const std::filesystem::path& existing, const std::filesystem::path& final);

// Removes "<dir>/.*.tmp-<pid>" files whose pid is not a live process (or is
// this process's own leftover). Returns the paths removed.
std::vector<std::filesystem::path> sweep_temporaries(const std::filesystem::path& dir);

// The ranked checkpoints of a run's directory as rank 0 keeps them during the
// run: those earlier runs committed, then those this run commits, pruned by
// retention once each new one is durable.
class CheckpointDirectory {
 public:
  explicit CheckpointDirectory(std::filesystem::path dir) : dir_(std::move(dir)) {}

  // Creates the directory, removes what an interrupted write left, and ranks
  // the checkpoints earlier runs committed (so that retention may prune them).
  void open();
  // Records a ranked checkpoint just committed. A resumed run can commit a
  // name an earlier run already used (it died between that commit and
  // pruning): the new file replaced the old, so it replaces the old entry
  // too, or pruning would delete it.
  void add_ranked(CheckpointInfo committed);
  // Deletes the ranked checkpoints `policy` no longer keeps. Called only
  // after the new checkpoint is durable.
  void prune(const RetentionPolicy& policy);

  const std::vector<CheckpointInfo>& ranked() const { return ranked_; }

 private:
  void forget(const std::filesystem::path& path);

  std::filesystem::path dir_;
  std::vector<CheckpointInfo> ranked_;
};

}  // namespace kiln
