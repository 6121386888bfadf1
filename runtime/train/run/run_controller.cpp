#include "train/run/run_controller.hpp"

#include <csignal>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "ckpt/checkpointer.hpp"
#include "distributed/process_group.hpp"
#include "metrics/loggers.hpp"
#include "train/run/epoch_collections.hpp"
#include "train/run/event_fan_out.hpp"
#include "train/session.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

RunAborted interrupted(int s) {
  return RunAborted(KILN_FAILURE_INTERRUPTED, std::string("interrupted by ") + signal_name(s));
}

}  // namespace

RunController::RunController(const RunSettings& settings, Command command, const std::atomic<int>* signal, Parts parts,
                             Snapshot snapshot)
    : settings_(settings), command_(command), signal_(signal), parts_(parts), snapshot_(std::move(snapshot)) {}

// Outside the votes. A preemption signal waits for the next vote, where the
// checkpoint is taken.
void RunController::check_signal() {
  const int s = pending_signal();
  if (s && !(s == settings_.preempt_signal && command_ == Command::fit)) throw interrupted(s);
}

// Stop decisions (a callback's request_stop, a signal, a preemption) are
// taken by all ranks together in one collective, never by one rank alone: a
// rank that left the loop early would leave the others waiting in the next
// gradient all-reduce.
Votes RunController::vote(const Votes& mine) {
  const int s = pending_signal();
  const bool preempt = s != 0 && s == settings_.preempt_signal;
  Votes all{mine.stop, preempt, mine.out_of_time};
  bool interrupt = s != 0 && !preempt;
  // Rank 0's asynchronous commit, looked at without waiting: a failure in
  // the background ends the run here, on every rank, with its cause.
  bool commit_failed = parts_.checkpointer.background_failed();
  if (parts_.group) {
    // The interrupting ranks are counted, their ranks and signals summed: a
    // rank stopping for a peer's signal names that peer and signal (when
    // one rank was signalled), never a signal it did not get.
    const int rank = parts_.group->rank();
    at::Tensor votes = at::tensor({all.stop ? 1.0 : 0.0, interrupt ? 1.0 : 0.0, all.preempt ? 1.0 : 0.0,
                                   all.out_of_time ? 1.0 : 0.0, commit_failed ? 1.0 : 0.0,
                                   interrupt ? static_cast<double>(rank) : 0.0, interrupt ? static_cast<double>(s) : 0.0},
                                  at::kDouble);
    parts_.group->all_reduce_sum(votes, "its stop vote");
    const auto v = votes.accessor<double, 1>();
    all.stop = v[0] > 0;
    all.preempt = v[2] > 0;
    all.out_of_time = v[3] > 0;
    commit_failed = v[4] > 0;
    if (v[1] > 0 && !interrupt) {
      const auto interrupting = static_cast<int64_t>(v[1]);
      throw RunAborted(KILN_FAILURE_INTERRUPTED,
                       interrupting == 1
                           ? fmt::format("interrupted by {} on rank {}; stopping with it", signal_name(static_cast<int>(v[6])),
                                         static_cast<int64_t>(v[5]))
                           : fmt::format("interrupted by signals on {} ranks; stopping with them", interrupting));
    }
  }
  if (interrupt) throw interrupted(s);
  if (commit_failed) parts_.checkpointer.raise_background_failure();
  return all;
}

// No vote: a rank whose sanity check failed has left, and this collective
// ends the others (docs/training.md).
void RunController::after_sanity_check() {
  if (!parts_.group) return;
  at::Tensor here = at::zeros({1}, at::kDouble);
  parts_.group->all_reduce_sum(here, "word that its sanity check passed");
}

// Every rank's unreduced metrics go into the checkpoint, read without a
// flush: a resumed epoch's metrics are then those of the uninterrupted
// epoch, bit for bit (docs/checkpoints.md).
std::filesystem::path RunController::save_checkpoint(const TrainPosition& position) {
  if (may_commit_ && !may_commit_(position)) return {};
  RunMetrics::Unreduced unreduced = parts_.metrics.gather_unreduced();
  if (parts_.collections) unreduced.collected = parts_.collections->gather_for_checkpoint();
  return parts_.checkpointer.commit(
      position, [&](const TrainPosition& at) { return snapshot_(at, std::move(unreduced)); });
}

void RunController::finish_checkpoints() {
  if (settings_.checkpointing) parts_.checkpointer.finish();
}

// Every rank names the file rank 0 committed (Checkpointer::commit returns
// it on each), so the supervisor's line names it whichever rank ends first.
void RunController::preempted(const TrainPosition& position) {
  const auto file = save_checkpoint(position);
  // The scheduler's grace period is for this: the file is durable before
  // the run says it is committed.
  finish_checkpoints();
  const std::string by = "preempted by " + std::string(signal_name(settings_.preempt_signal));
  if (file.empty()) throw RunAborted(KILN_FAILURE_PREEMPTED, by + "; no checkpoint was committed");
  throw RunAborted(KILN_FAILURE_PREEMPTED,
                   by + "; checkpoint committed: " + file.string() + " (continue with --resume last)");
}

void RunController::log_row(const LogRow& row) {
  if (parts_.group && parts_.group->rank() != 0) return;
  LogRow out = row;
  // The training epoch's monitors (taken at train_epoch_end, just before).
  out.metrics.merge(parts_.events.take_epoch_monitors());
  parts_.loggers.log(out);
  parts_.loggers.flush();  // an epoch's rows are durable at its end
}

}  // namespace kiln
