#include "ckpt/checkpointer.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "ckpt/checkpoint_dir.hpp"
#include "util/errors.hpp"

namespace kiln {

Checkpointer::Checkpointer(const CheckpointConfig& config, int rank, AllSucceeded all_succeeded)
    : config_(config), rank_(rank), all_succeeded_(std::move(all_succeeded)) {}

RetentionPolicy Checkpointer::policy() const {
  return RetentionPolicy{config_.monitor, config_.mode, config_.save_top_k};
}

void Checkpointer::open() {
  if (rank_ != 0) return;
  std::filesystem::create_directories(config_.dir);
  for (const auto& removed : sweep_temporaries(config_.dir))
    spdlog::warn("removed {} left by an interrupted checkpoint write", removed.string());
  ranked_ = ranked_only(scan_checkpoints(config_.dir, [](const CheckpointError& e) { spdlog::warn("ignoring {}", e.what()); }));
}

std::filesystem::path Checkpointer::commit(const TrainPosition& position,
                                           const std::function<RunStateView(const TrainPosition&)>& state) {
  std::filesystem::path written;
  std::string error;
  if (rank_ == 0) {
    try {
      const RunStateView view = state(position);
      const auto ranked = config_.dir / checkpoint_name(position.epoch, position.global_step);
      const auto last = config_.dir / "last.ckpt";
      if (config_.save_top_k != 0) {
        save_run_state(ranked, view);
        // A resumed run can commit a name an earlier run already used (it
        // died between that commit and pruning): the new file replaced the
        // old, so it replaces the old entry too, or pruning would delete it.
        ranked_.erase(std::remove_if(ranked_.begin(), ranked_.end(), [&](const CheckpointInfo& i) { return i.path == ranked; }),
                      ranked_.end());
        ranked_.push_back(CheckpointInfo{ranked, position.epoch, position.global_step, view.monitored, false});
        written = ranked;
        if (config_.save_last) link_checkpoint(ranked, last);
      } else {
        save_run_state(last, view);
        written = last;
      }
      // Older checkpoints go only now, after the new one is durable.
      for (const auto& old : to_delete(ranked_, policy())) {
        std::error_code ec;
        std::filesystem::remove(old, ec);
        ranked_.erase(std::remove_if(ranked_.begin(), ranked_.end(), [&](const CheckpointInfo& i) { return i.path == old; }),
                      ranked_.end());
      }
      spdlog::info("checkpoint committed: {}", written.string());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Every rank returns the file committed: its name follows from the
  // position, and each rank learns here that rank 0 wrote it.
  if (all_succeeded_(error.empty()))
    return rank_ == 0 ? written
                      : config_.dir / (config_.save_top_k != 0 ? checkpoint_name(position.epoch, position.global_step)
                                                               : std::string("last.ckpt"));
  // The cause is rank 0's; the other ranks only learn that it failed.
  if (rank_ != 0) throw PeerFailure("rank 0 failed to commit a checkpoint (its report names the cause)");
  throw std::runtime_error("checkpoint not committed: " + error);
}

std::string Checkpointer::restore(const std::filesystem::path& file, RunStateView& view) {
  const CheckpointFile checkpoint = CheckpointFile::read(file);
  restore_run_state(checkpoint, view);
  spdlog::info("resumed from {}: epoch {}, batch {}, step {}", file.string(), view.position.epoch,
               view.position.next_batch, view.position.global_step);
  std::error_code ec;
  return fmt::format("{} ({} bytes): epoch {}, batch {}, step {}", file.filename().string(),
                     std::filesystem::file_size(file, ec), view.position.epoch, view.position.next_batch,
                     view.position.global_step);
}

}  // namespace kiln
