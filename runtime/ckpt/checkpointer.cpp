#include "ckpt/checkpointer.hpp"

#include <spdlog/spdlog.h>

#include "ckpt/checkpoint_dir.hpp"
#include "util/errors.hpp"

namespace kiln {

Checkpointer::Checkpointer(const CheckpointConfig& config, int rank, AllSucceeded all_succeeded)
    : config_(config), rank_(rank), all_succeeded_(std::move(all_succeeded)), directory_(config.dir) {}

RetentionPolicy Checkpointer::policy() const {
  return RetentionPolicy{config_.monitor, config_.mode, config_.save_top_k};
}

void Checkpointer::open() {
  if (rank_ != 0) return;
  directory_.open();
}

std::filesystem::path Checkpointer::write(const TrainPosition& position,
                                          const std::function<RunStateView(const TrainPosition&)>& state) {
  const RunStateView view = state(position);
  const auto ranked = config_.dir / checkpoint_name(position.epoch, position.global_step);
  const auto last = config_.dir / "last.ckpt";
  std::filesystem::path written;
  if (config_.save_top_k != 0) {
    save_run_state(ranked, view);
    directory_.add_ranked(CheckpointInfo{ranked, position.epoch, position.global_step, view.monitored, false});
    written = ranked;
    if (config_.save_last) link_checkpoint(ranked, last);
  } else {
    save_run_state(last, view);
    written = last;
  }
  // Older checkpoints go only now, after the new one is durable.
  directory_.prune(policy());
  spdlog::info("checkpoint committed: {}", written.string());
  return written;
}

std::filesystem::path Checkpointer::commit(const TrainPosition& position,
                                           const std::function<RunStateView(const TrainPosition&)>& state) {
  std::filesystem::path written;
  std::string error;
  if (rank_ == 0) {
    try {
      written = write(position, state);
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
