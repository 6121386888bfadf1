#include "ckpt/checkpointer.hpp"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <utility>

#include <spdlog/spdlog.h>

#include "ckpt/checkpoint_dir.hpp"
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
}

std::filesystem::path Checkpointer::file_for(const TrainPosition& position) const {
  return config_.dir / (config_.save_top_k != 0 ? checkpoint_name(position.epoch, position.global_step)
                                               : std::string("last.ckpt"));
}

void Checkpointer::write(const std::filesystem::path& file, const TrainPosition& position,
                         std::optional<double> monitored, const CheckpointSnapshot& snapshot) {
  commit_checkpoint(file, snapshot);
  if (config_.save_top_k != 0) {
    directory_.add_ranked(CheckpointInfo{file, position.epoch, position.global_step, monitored, false});
    if (config_.save_last) link_checkpoint(file, config_.dir / "last.ckpt");
  }
  // Older checkpoints go only now, after the new one is durable.
  directory_.prune(policy());
  spdlog::info("checkpoint committed: {}", file.string());
}

void Checkpointer::agree(const std::string& error) {
  if (all_succeeded_(error.empty())) return;
  // The cause is rank 0's; the other ranks only learn that it failed.
  if (rank_ != 0) throw PeerFailure("rank 0 failed to commit a checkpoint (its report names the cause)");
  throw std::runtime_error("checkpoint not committed: " + error);
}

std::filesystem::path Checkpointer::commit(const TrainPosition& position,
                                           const Prepare& prepare) {
  const std::filesystem::path file = file_for(position);
  const auto started = std::chrono::steady_clock::now();
  for (const auto& gather : gathers_) gather();
  size_t snapshot_bytes = 0;
  auto previous_done = started, snapshot_done = started;
  std::string error;
  if (rank_ == 0) {
    // The one in flight first: its failure is this commit's (nothing newer
    // is written over a failing disk), and at most one is ever in flight.
    if (auto failed = background_.wait()) error = *failed;
    if (error.empty()) error = std::exchange(background_error_, {});
    previous_done = std::chrono::steady_clock::now();
    if (error.empty()) {
      try {
        const std::optional<double> monitored = prepare(position);
        // Asynchronous: the buffers stay for the next snapshot (docs/checkpoints.md, "Memory").
        auto snapshot =
            std::make_shared<const CheckpointSnapshot>(parts_.snapshot(config_.async ? &snapshot_buffers_ : nullptr));
        snapshot_bytes = snapshot->bytes();
        snapshot_done = std::chrono::steady_clock::now();
        if (config_.async) {
          background_.start([this, file, position, monitored, snapshot] {
            run_on_idle_cpu_only();
            write(file, position, monitored, *snapshot);
          });
        } else {
          write(file, position, monitored, *snapshot);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
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
  return file;
}

void Checkpointer::finish() {
  if (!config_.async) return;
  std::string error;
  if (rank_ == 0) {
    if (auto failed = background_.wait()) error = *failed;
    if (error.empty()) error = std::exchange(background_error_, {});
  }
  agree(error);
}

bool Checkpointer::background_failed() {
  if (rank_ != 0) return false;
  if (auto failed = background_.poll()) background_error_ = *failed;
  return !background_error_.empty();
}

void Checkpointer::raise_background_failure() {
  if (rank_ != 0) throw PeerFailure("rank 0 failed to commit a checkpoint (its report names the cause)");
  throw std::runtime_error("checkpoint not committed: " + std::exchange(background_error_, {}));
}

void Checkpointer::restore(const std::filesystem::path& file) const { parts_.restore(CheckpointFile::read(file)); }

}  // namespace kiln
