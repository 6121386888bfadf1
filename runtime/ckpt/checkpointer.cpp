#include "ckpt/checkpointer.hpp"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <utility>

#include <spdlog/spdlog.h>

#include "ckpt/checkpoint_dir.hpp"
#include "ckpt/rank_files.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

// The commit thread (and the checksum thread it starts, which inherits its
// policy) runs as SCHED_IDLE: only on CPU time nothing else wants, so it
// never takes a core from training's threads, which wait for each other at
// every parallel region. When the loop waits for the write, the cores are
// idle and it runs at full speed. (The steps beside a write still ran slower
// on 2 cores than a synchronous commit costs: bench/README.md; hence async
// is off by default.) Per thread on Linux; best effort.
void run_on_idle_cpu_only() {
  sched_param none{};
  none.sched_priority = 0;
  ::sched_setscheduler(static_cast<pid_t>(::gettid()), SCHED_IDLE, &none);
}

}  // namespace

Checkpointer::Checkpointer(const CheckpointConfig& config, int rank, AllSucceeded all_succeeded)
    : config_(config), rank_(rank), all_succeeded_(std::move(all_succeeded)), directory_(config.dir) {}

RetentionPolicy Checkpointer::policy() const {
  return RetentionPolicy{config_.monitor, config_.mode, config_.save_top_k};
}

void Checkpointer::open() {
  if (rank_ != 0) return;
  directory_.open();
  if (const int removed = remove_unnamed_rank_files(config_.dir))
    spdlog::warn("removed {} rank file(s) in {} that no checkpoint names (left by an interrupted commit)", removed,
                 rank_files_dir(config_.dir).string());
}

std::filesystem::path Checkpointer::file_for(const TrainPosition& position) const {
  return config_.dir / (config_.save_top_k != 0 ? checkpoint_name(position.epoch, position.global_step)
                                               : std::string("last.ckpt"));
}

void Checkpointer::write(const std::filesystem::path& file, const TrainPosition& position,
                         std::optional<double> monitored, const CheckpointSnapshot& snapshot,
                         const CheckpointSnapshot* mine) {
  if (mine) {
    // Every rank's file is durable before the checkpoint that names them is.
    write_rank_file(rank_file_path(config_.dir, rank_files_tag_.prefix, rank_, rank_files_->world), *mine);
    await_rank_files(config_.dir, rank_files_tag_.prefix, rank_files_->world, rank_files_->timeout);
    fault_point("ckpt:before_index");
  }
  commit_checkpoint(file, snapshot);
  if (config_.save_top_k != 0) {
    directory_.add_ranked(CheckpointInfo{file, position.epoch, position.global_step, monitored, false});
    if (config_.save_last) link_checkpoint(file, config_.dir / "last.ckpt");
  }
  // Older checkpoints go only now, after the new one is durable.
  directory_.prune(policy());
  // Those of the checkpoints pruned, whichever run wrote them.
  remove_unnamed_rank_files(config_.dir);
  spdlog::info("checkpoint committed: {}", file.string());
}

void Checkpointer::write_rank_file(const std::filesystem::path& file, const CheckpointSnapshot& snapshot) {
  try {
    std::filesystem::create_directories(file.parent_path());
    fault_point(("ckpt:rank" + std::to_string(rank_) + ":before_rank_file").c_str());
    commit_checkpoint(file, snapshot);
  } catch (const std::exception& e) {
    report_rank_file_failure(file, e.what());
    throw;
  }
}

void Checkpointer::agree(const std::string& error) {
  if (all_succeeded_(error.empty())) return;
  if (!error.empty()) throw std::runtime_error("checkpoint not committed: " + error);
  // The cause is another rank's (its report names it).
  if (rank_ != 0 || rank_files_)
    throw PeerFailure(std::string(rank_files_ ? "another rank" : "rank 0") +
                      " failed to commit a checkpoint (its report names the cause)");
  throw std::runtime_error("checkpoint not committed: another rank failed to write its part");
}

std::filesystem::path Checkpointer::commit(const TrainPosition& position, const Prepare& prepare) {
  const std::filesystem::path file = file_for(position);
  const auto started = std::chrono::steady_clock::now();
  const bool writes = rank_ == 0 || rank_files_.has_value();
  std::string error;
  // The one in flight first: its failure is this commit's (nothing newer is
  // written over a failing disk), and at most one is ever in flight. With
  // rank files this comes before the collectives below, so that no rank
  // writes its next file while rank 0 may still be removing unnamed ones.
  if (writes) {
    if (auto failed = background_.wait()) error = *failed;
    if (error.empty()) error = std::exchange(background_error_, {});
  }
  const auto previous_done = std::chrono::steady_clock::now();
  // However the commit ends (a failure below throws from agree()).
  struct Releases {
    const std::vector<std::function<void()>>& each;
    ~Releases() {
      for (const auto& release : each) release();
    }
  } releases{releases_};
  for (const auto& gather : gathers_) gather();
  if (rank_files_) rank_files_tag_ = RankFilesTag{rank_files_prefix(file, rank_files_->agree_nonce()), rank_files_->world};
  size_t snapshot_bytes = 0;
  auto snapshot_done = previous_done;
  if (writes && error.empty()) {
    try {
      // Asynchronous: the buffers stay for the next snapshot (docs/checkpoints.md, "Memory").
      std::shared_ptr<const CheckpointSnapshot> snapshot, mine;
      std::optional<double> monitored;
      if (rank_ == 0) {
        monitored = prepare(position);
        snapshot =
            std::make_shared<const CheckpointSnapshot>(parts_.snapshot(config_.async ? &snapshot_buffers_ : nullptr));
        snapshot_bytes += snapshot->bytes();
      }
      if (rank_files_) {
        mine = std::make_shared<const CheckpointSnapshot>(
            rank_parts_.snapshot(config_.async ? &rank_snapshot_buffers_ : nullptr));
        snapshot_bytes += mine->bytes();
      }
      snapshot_done = std::chrono::steady_clock::now();
      const std::filesystem::path own =
          rank_files_ ? rank_file_path(config_.dir, rank_files_tag_.prefix, rank_, rank_files_->world) : file;
      auto work = [this, file, own, position, monitored, snapshot, mine] {
        if (rank_ == 0)
          write(file, position, monitored, *snapshot, mine.get());
        else
          write_rank_file(own, *mine);
      };
      if (config_.async) {
        background_.start([work] {
          run_on_idle_cpu_only();
          work();
        });
      } else {
        work();
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error);
  // What bench/async_ckpt.sh reads: how long the step loop stood still.
  using Ms = std::chrono::duration<double, std::milli>;
  if (rank_ == 0)
    spdlog::debug("checkpoint {}: the step loop waited {:.1f} ms (for the previous write {:.1f} ms, snapshot {:.1f} ms "
                  "of {:.1f} MB{})",
                  file.filename().string(), Ms(std::chrono::steady_clock::now() - started).count(),
                  Ms(previous_done - started).count(), Ms(snapshot_done - previous_done).count(),
                  static_cast<double>(snapshot_bytes) / 1e6, config_.async ? "; written in the background" : "");
  last_committed_ = file;
  return file;
}

void Checkpointer::finish() {
  if (!config_.async) return;
  std::string error;
  if (rank_ == 0 || rank_files_) {
    if (auto failed = background_.wait()) error = *failed;
    if (error.empty()) error = std::exchange(background_error_, {});
  }
  agree(error);
}

bool Checkpointer::background_failed() {
  if (rank_ != 0 && !rank_files_) return false;
  if (auto failed = background_.poll()) background_error_ = *failed;
  return !background_error_.empty();
}

void Checkpointer::raise_background_failure() {
  if (!background_error_.empty())
    throw std::runtime_error("checkpoint not committed: " + std::exchange(background_error_, {}));
  throw PeerFailure(std::string(rank_files_ ? "another rank" : "rank 0") +
                    " failed to commit a checkpoint (its report names the cause)");
}

void Checkpointer::restore(const std::filesystem::path& file) const { parts_.restore(CheckpointFile::read(file)); }

}  // namespace kiln
