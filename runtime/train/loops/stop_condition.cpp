#include "train/loops/stop_condition.hpp"

#include <cstdio>

#include <spdlog/spdlog.h>

namespace kiln {

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::max_epochs: return "max_epochs";
    case StopReason::max_steps: return "max_steps";
    case StopReason::requested: return "requested";
    case StopReason::agreed: return "agreed";
    case StopReason::preempted: return "preempted";
    case StopReason::max_time: return "max_time";
  }
  return "?";
}

StopCondition::StopCondition(int64_t max_epochs, int64_t max_steps, int64_t vote_every_n_steps,
                             std::optional<int64_t> max_seconds)
    : max_epochs_(max_epochs),
      max_steps_(max_steps),
      vote_every_(vote_every_n_steps > 0 ? vote_every_n_steps : 1),
      max_seconds_(max_seconds) {}

void StopCondition::start_clock() { started_ = std::chrono::steady_clock::now(); }

bool StopCondition::out_of_time() const {
  return max_seconds_ && std::chrono::steady_clock::now() - started_ >= std::chrono::seconds(*max_seconds_);
}

void StopCondition::request(const std::string& who, const std::string& why) {
  // The first request is the one named; the request itself is an atomic
  // flag, as callbacks may ask from any thread.
  if (!requested_.exchange(true)) {
    requested_by_ = "'" + who + "': " + why;
    spdlog::info("stop requested by {}", requested_by_);
  }
}

std::optional<StopReason> StopCondition::decide(std::optional<StopReason> reason) {
  if (reason && !reason_) {
    reason_ = reason;
    spdlog::info("stopping: {}", describe());
  }
  return reason;
}

std::optional<StopReason> StopCondition::take_vote(RunControl& control) {
  Votes mine;
  mine.stop = requested_.load();
  // Each rank reads its own clock; the vote makes the first to run out
  // stop them all at the same step.
  mine.out_of_time = out_of_time();
  const Votes all = control.vote(mine);
  if (all.preempt) return StopReason::preempted;
  if (all.stop) return mine.stop ? StopReason::requested : StopReason::agreed;
  if (all.out_of_time) return StopReason::max_time;
  return std::nullopt;
}

std::optional<StopReason> StopCondition::before_epoch(int64_t epoch, int64_t global_step) {
  at_epochs_ = epoch;
  at_step_ = global_step;
  if (max_epochs_ >= 0 && epoch >= max_epochs_) return decide(StopReason::max_epochs);
  if (max_steps_ >= 0 && global_step >= max_steps_) return decide(StopReason::max_steps);
  return std::nullopt;
}

std::optional<StopReason> StopCondition::after_step(RunControl& control, int64_t global_step) {
  at_step_ = global_step;
  std::optional<StopReason> reason;
  if (global_step % vote_every_ == 0) reason = take_vote(control);
  if (!reason && max_steps_ >= 0 && global_step >= max_steps_) reason = StopReason::max_steps;
  return decide(reason);
}

std::optional<StopReason> StopCondition::after_epoch(RunControl& control, int64_t epochs_done, int64_t global_step) {
  at_step_ = global_step;
  at_epochs_ = epochs_done;
  // Every rank reaches every epoch end, so the vote is always taken here (a
  // preemption that arrived after an earlier stop still counts).
  std::optional<StopReason> reason = take_vote(control);
  if (!reason) reason = reason_;
  if (!reason && max_steps_ >= 0 && global_step >= max_steps_) reason = StopReason::max_steps;
  if (!reason && max_epochs_ >= 0 && epochs_done >= max_epochs_) reason = StopReason::max_epochs;
  return decide(reason);
}

std::string StopCondition::describe() const {
  if (!reason_) return "not stopped";
  switch (*reason_) {
    case StopReason::max_epochs: return "max_epochs=" + std::to_string(max_epochs_) + " reached";
    case StopReason::max_steps: return "max_steps=" + std::to_string(max_steps_) + " reached (step " + std::to_string(at_step_) + ")";
    case StopReason::requested: return "requested by " + requested_by_ + " (step " + std::to_string(at_step_) + ")";
    case StopReason::agreed: return "another rank's callback asked to stop; all ranks agreed (step " + std::to_string(at_step_) + ")";
    case StopReason::preempted: return "preempted (step " + std::to_string(at_step_) + ")";
    case StopReason::max_time:
    {
      const long long s = max_seconds_.value_or(0);
      char limit[32];
      std::snprintf(limit, sizeof limit, "%02lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
      return "max_time=" + std::string(limit) + " reached (step " + std::to_string(at_step_) + ")";
    }
  }
  return "?";
}

}  // namespace kiln
