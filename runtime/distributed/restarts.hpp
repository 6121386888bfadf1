// Restarts of kiln's own launch (`kiln fit --max-restarts N`,
// distributed.max_restarts), torchrun's --max-restarts with the part a user's
// script had to write built in: after a worker fails, the supervisor has
// already ended every worker with its cleanup and named the cause; then the
// workers start again from the newest committed checkpoint (from the start if
// there is none), each restart logged as one line. What cannot heal is never
// restarted: bad input (exit 2), ranks that disagree at the start-up
// agreement, a preemption (exit 75: the scheduler owns it), an interruption,
// and a crash loop (no checkpoint committed since the last restart).
// No LibTorch here.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "distributed/supervisor.hpp"

namespace kiln {

// The environment variable that tells a restarted worker the checkpoint to
// resume from, in place of its command line's --resume.
inline constexpr const char* kResumeFromVariable = "KILN_RESUME_FROM";

struct CommittedCheckpoint {
  std::filesystem::path path;
  int64_t global_step = 0;
};

struct RestartPlan {
  int max_restarts = 0;
  // The newest committed checkpoint of the run's directory, if any.
  std::function<std::optional<CommittedCheckpoint>()> newest;
  // What the first start resumes from (its --resume): a restart before any
  // newer commit resumes from it again.
  std::optional<std::filesystem::path> first_resume;
};

// Why the failed attempt is not restarted, or nullopt to restart it.
// `restarts_done`: restarts before this failure; `progressed`: whether a
// newer checkpoint was committed during the attempt that failed.
std::optional<std::string> why_not_restart(const SupervisorResult& failed, int restarts_done, int max_restarts,
                                           bool progressed);

// Runs the workers, restarting them as the plan allows. Returns the last
// attempt's result (its report is the cause that ended the run).
SupervisorResult supervise_with_restarts(SupervisorOptions options, const std::atomic<int>* signal,
                                         const RestartPlan& plan);

}  // namespace kiln
