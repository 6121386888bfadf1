// Checkpoint files every rank writes beside rank 0's (distributed.shard:
// each rank's share of the optimizer state, written in parallel, never
// gathered into one process). A commit's rank files are
//   <checkpoint dir>/shards/<checkpoint file name>.<nonce>.rank<r>-of-<W>
// and the checkpoint file (rank 0's, written last) names them by its
// meta's `rank_files` (the "<checkpoint file name>.<nonce>" part) and
// `rank_files_world`. Each is committed as a checkpoint file is (temporary,
// fsync, rename), so it exists only once durable; the checkpoint file is
// renamed into place only after every rank file exists: a checkpoint is
// loadable once its file is, and a kill -9 of any rank at any point leaves
// the last committed one as it was (its rank files carry another nonce and
// are never written again). Rank files no checkpoint names are removed
// after each commit and at start-up. No LibTorch here.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_file.hpp"

namespace kiln {

// The folder of a checkpoint directory that holds rank files.
std::filesystem::path rank_files_dir(const std::filesystem::path& checkpoint_dir);

// What a checkpoint's meta records: `prefix` = "<file name>.<nonce hex>".
std::string rank_files_prefix(const std::filesystem::path& checkpoint_file, uint64_t nonce);
std::filesystem::path rank_file_path(const std::filesystem::path& checkpoint_dir, const std::string& prefix, int rank,
                                     int world);

// A rank whose write failed leaves "<rank file>.failed" holding the cause,
// so that rank 0 stops waiting at once and names it (best effort).
void report_rank_file_failure(const std::filesystem::path& rank_file, const std::string& cause);

// Rank 0: waits until every rank's file of `prefix` exists; throws
// std::runtime_error naming the rank that reported a failure, or did not
// write within `timeout`.
void await_rank_files(const std::filesystem::path& checkpoint_dir, const std::string& prefix, int world,
                      std::chrono::milliseconds timeout);

// The rank files `checkpoint` names, read and verified (checksums), by
// rank; empty when it names none (a replicated checkpoint). Throws
// CheckpointError naming the checkpoint and the missing or damaged file.
std::vector<CheckpointFile> read_rank_files(const CheckpointFile& checkpoint);

// Removes from `checkpoint_dir`'s rank files every one that no checkpoint
// file there names (read from each file's head), with failure markers and
// temporaries of dead writers. Returns how many it removed.
int remove_unnamed_rank_files(const std::filesystem::path& checkpoint_dir);

}  // namespace kiln
