// Why a fit ends: one place decides it and logs exactly one reason, the
// first that holds (Lightning's fit loop keeps the same rule). Ranks stop
// together: a callback's request or a preemption signal counts only after a
// vote (RunControl::vote), which every rank takes at the same step.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "loop_parts/loop_parts.hpp"

namespace kiln {

enum class StopReason {
  max_epochs,  // [trainer] max_epochs reached
  max_steps,   // [trainer] max_steps reached
  requested,   // a callback on this rank asked to stop (request_stop)
  agreed,      // a callback on another rank asked, and the ranks agreed
  preempted,   // the preemption signal arrived (a checkpoint, then exit 75)
  max_time,    // [trainer] max_time passed (on some rank's clock; all agreed)
};
const char* stop_reason_name(StopReason reason);

class StopCondition {
 public:
  // `vote_every_n_steps`: how often ranks vote inside an epoch (1 in a single
  // process, where the "vote" is free).
  // `max_seconds`: [trainer] max_time, counted from start_clock().
  StopCondition(int64_t max_epochs, int64_t max_steps, int64_t vote_every_n_steps,
                std::optional<int64_t> max_seconds = std::nullopt);

  // The fit starts: max_time counts from here.
  void start_clock();
  // Whether max_time has passed on this rank's clock (false without one).
  bool out_of_time() const;

  // A callback's request_stop (any thread). Acted on at the next vote.
  void request(const std::string& who, const std::string& why);
  bool requested() const { return requested_.load(); }

  // Before epoch `epoch` (0-based) starts, `global_step` steps taken:
  // max_epochs, and max_steps (a run resumed at or past max_steps takes no
  // step more).
  std::optional<StopReason> before_epoch(int64_t epoch, int64_t global_step);
  // After an optimizer step: max_steps, and at vote steps the vote.
  std::optional<StopReason> after_step(RunControl& control, int64_t global_step);
  // After an epoch (`epochs_done` complete): the vote, max_steps, max_epochs.
  std::optional<StopReason> after_epoch(RunControl& control, int64_t epochs_done, int64_t global_step);

  // The reason the fit ended, once one held.
  std::optional<StopReason> reason() const { return reason_; }
  std::string describe() const;

 private:
  std::optional<StopReason> decide(std::optional<StopReason> reason);
  std::optional<StopReason> take_vote(RunControl& control);

  int64_t max_epochs_, max_steps_, vote_every_;
  std::optional<int64_t> max_seconds_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<bool> requested_{false};
  std::string requested_by_;
  std::optional<StopReason> reason_;
  int64_t at_step_ = 0, at_epochs_ = 0;
};

}  // namespace kiln
