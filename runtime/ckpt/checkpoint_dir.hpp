// A run's checkpoint directory as kiln finds it: the one scan (used to rank
// what earlier runs left and to answer `--resume last|best`), and the `last`
// link. No LibTorch here.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
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
// an InputError naming the problem.
std::filesystem::path resolve_resume(const std::string& spec, const std::filesystem::path& dir,
                                     const RetentionPolicy& policy);

// Publishes a committed checkpoint under a second name (last.ckpt): atomic,
// durable, and no second copy of the bytes (util/durable_file).
void link_checkpoint(const std::filesystem::path& existing, const std::filesystem::path& final);

}  // namespace kiln
