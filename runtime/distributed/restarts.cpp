#include "distributed/restarts.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kiln {

namespace {

constexpr int kBadInputExit = 2;     // kiln::kExitBadInput
constexpr int kPreemptedExit = 75;   // kiln::kExitPreempted
constexpr int kInterruptedExit = 130;

void set_env(SupervisorOptions& options, const std::string& name, const std::string& value) {
  auto& env = options.env;
  env.erase(std::remove_if(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; }), env.end());
  env.emplace_back(name, value);
}

}  // namespace

std::optional<std::string> why_not_restart(const SupervisorResult& failed, int restarts_done, int max_restarts,
                                           bool progressed) {
  if (failed.exit_code == kPreemptedExit) return "preempted: the scheduler decides whether the job runs again";
  if (failed.exit_code == kInterruptedExit || failed.rank < 0) return "interrupted";
  if (failed.exit_code == kBadInputExit) return "bad input (exit 2) cannot heal";
  if (failed.phase == "start-up agreement" && failed.reported)
    return "the ranks disagreed at the start-up agreement, which a restart cannot change";
  if (restarts_done >= max_restarts)
    return max_restarts == 0 ? std::string() : "all " + std::to_string(max_restarts) + " restarts are used";
  if (restarts_done > 0 && !progressed)
    return "no checkpoint was committed since restart " + std::to_string(restarts_done) +
           ", so another would fail the same way (a crash loop)";
  return std::nullopt;
}

SupervisorResult supervise_with_restarts(SupervisorOptions options, const std::atomic<int>* signal,
                                         const RestartPlan& plan) {
  int restarts = 0;
  std::optional<CommittedCheckpoint> at_start = plan.max_restarts > 0 ? plan.newest() : std::nullopt;
  for (;;) {
    SupervisorResult result = supervise(options, signal);
    if (result.exit_code == 0) return result;
    const std::optional<CommittedCheckpoint> now = plan.max_restarts > 0 ? plan.newest() : std::nullopt;
    const bool progressed = now && (!at_start || now->global_step > at_start->global_step);
    const bool signalled = signal && signal->load() != 0;
    std::optional<std::string> why = signalled ? std::optional<std::string>("interrupted")
                                               : why_not_restart(result, restarts, plan.max_restarts, progressed);
    if (why) {
      if (!why->empty() && plan.max_restarts > 0) spdlog::warn("not restarting: {}", *why);
      return result;
    }
    ++restarts;
    std::optional<std::filesystem::path> from = now ? std::optional(now->path) : plan.first_resume;
    spdlog::warn("restart {}/{} after: {}; {}", restarts, plan.max_restarts, result.report,
                 from ? "resuming from " + from->filename().string() : std::string("starting over (no checkpoint committed yet)"));
    if (from) set_env(options, kResumeFromVariable, from->string());
    at_start = now;
  }
}

}  // namespace kiln
