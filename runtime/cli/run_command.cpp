#include "cli/run_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include <spdlog/spdlog.h>

#include "ckpt/checkpoint_dir.hpp"
#include "distributed/launcher_error_file.hpp"
#include "config/manifest.hpp"
#include "device/cuda_facts.hpp"
#include "distributed/heartbeat.hpp"
#include "distributed/launch_env.hpp"
#include "distributed/restarts.hpp"
#include "distributed/supervisor.hpp"
#include "metrics/loggers.hpp"
#include "plugin/loader.hpp"
#include "train/run/trainer.hpp"
#include "util/errors.hpp"
#include "util/process_info.hpp"
#include "util/run_dir_lock.hpp"

namespace kiln {

namespace {

spdlog::level::level_enum spdlog_level(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

// The checkpoint --resume (or --ckpt) names, resolved: a file, `last`,
// `best`, or (fit only) `auto`: the newest committed checkpoint if there is
// one, else a fresh start, logged either way.
std::optional<std::filesystem::path> resume_checkpoint(const std::string& resume, const Manifest& manifest,
                                                       Command command) {
  if (resume.empty()) return std::nullopt;
  const RetentionPolicy policy{manifest.checkpoint.monitor, manifest.checkpoint.mode, 1};
  if (resume == "auto") {
    if (command != Command::fit)
      throw InputError("--ckpt auto: `auto` is fit's --resume (continue if a checkpoint exists, else start "
                       "fresh); evaluating needs weights: name a file, `last` or `best`");
    const std::optional<CheckpointInfo> newest = newest_checkpoint(manifest.checkpoint.dir, policy);
    if (newest)
      spdlog::info("--resume auto: resuming from {} (step {})", newest->path.string(), newest->global_step);
    else
      spdlog::info("--resume auto: no checkpoint in {}; a fresh start", manifest.checkpoint.dir.string());
    return newest ? std::optional(newest->path) : std::nullopt;
  }
  const std::string option = command == Command::fit ? "--resume" : "--ckpt";
  std::filesystem::path file = resolve_resume(resume, manifest.checkpoint.dir, policy, option);
  spdlog::debug("start-up: {} {} resolved to {} at {:.2f} s", option, resume, file.string(), seconds_since_start());
  return file;
}

// Several processes on this machine: kiln's supervisor starts the workers
// (each runs this command line again, as a launched rank) and watches them.
// With max_restarts, a failed run starts again from its newest committed
// checkpoint (distributed/restarts.hpp).
int supervise_workers(const Manifest& manifest, const std::vector<std::string>& argv, bool run_dir_locked,
                      const std::atomic<int>* signal, int max_restarts,
                      const std::optional<std::filesystem::path>& resume_file) {
  SupervisorOptions options;
  options.processes = static_cast<int>(manifest.distributed.processes);
  options.argv = argv;
  options.master_addr = manifest.distributed.master_addr;
  options.master_port = static_cast<int>(manifest.distributed.master_port);
  if (run_dir_locked) options.env.emplace_back(kRunDirLockedVariable, "1");
  // A worker blocked on a stopped peer fails its collective after the
  // timeout; a stopped worker itself is caught by its silent heartbeat.
  // A beat comes every second from a thread of its own, so only a stopped or
  // frozen process misses them: half the collective timeout (2-10 s) lets
  // the supervisor name it before its peers' collectives time out.
  const double beat_s = std::clamp(manifest.distributed.timeout_s / 2, 2.0, 10.0);
  options.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(beat_s * 1000));
  // Until its first beat a worker is starting (exec, LibTorch's libraries):
  // bounded by the same timeout as the rendezvous that follows.
  options.startup_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::max(manifest.distributed.timeout_s, 10.0) * 1000));
  RestartPlan plan;
  plan.max_restarts = max_restarts;
  plan.first_resume = resume_file;
  const RetentionPolicy policy{manifest.checkpoint.monitor, manifest.checkpoint.mode, 1};
  plan.newest = [dir = manifest.checkpoint.dir, policy]() -> std::optional<CommittedCheckpoint> {
    const auto newest = newest_checkpoint(dir, policy);
    if (!newest) return std::nullopt;
    return CommittedCheckpoint{newest->path, newest->global_step};
  };
  const SupervisorResult result = supervise_with_restarts(options, signal, plan);
  if (result.exit_code == kExitPreempted)
    std::cerr << "kiln: " << result.report << std::endl;
  else if (result.exit_code != 0)
    std::cerr << "kiln: error: " << result.report << std::endl;
  return result.exit_code;
}

// The exit code of a run that has ended, its failure (if any) reported.
int finish_run(const RunOutcome& outcome, Heartbeat& heartbeat) {
  if (!outcome.failure) return kExitOk;
  const bool preempted = outcome.failure->reason == KILN_FAILURE_PREEMPTED;
  std::cerr << (preempted ? "kiln: " : "kiln: error: ") << outcome.failure->report << std::endl;
  // An interruption is the supervisor's own SIGTERM, or a signal the
  // supervisor saw too: never the cause it reports.
  const bool root = outcome.failure->reason != KILN_FAILURE_PEER_FAILED &&
                    outcome.failure->reason != KILN_FAILURE_INTERRUPTED;
  heartbeat.report_failure(root, outcome.failure->report);
  // The launcher's summary names the cause (a preemption is no failure).
  if (!preempted) write_launcher_error_file(outcome.failure->report, root);
  int code = outcome.failure->bad_input ? kExitBadInput : kExitFailure;
  if (outcome.failure->reason == KILN_FAILURE_INTERRUPTED) code = kExitInterrupted;
  if (outcome.failure->reason == KILN_FAILURE_PREEMPTED) code = kExitPreempted;
  if (outcome.calls_abandoned) {
    // A get_batch still runs in plugin code: exit without running static
    // destructors (LibTorch's, the loader's) under it.
    std::cout.flush();
    std::cerr.flush();
    spdlog::shutdown();
    std::fflush(nullptr);
    ::_exit(code);
  }
  return code;
}

}  // namespace

int run_command(Command command, const std::string& manifest_file, std::vector<std::string> overrides,
                int processes, int max_restarts_option, const std::string& resume, const std::vector<std::string>& argv,
                const std::atomic<int>* signal, Heartbeat& heartbeat, double main_reached_s) {
  heartbeat.phase("loading the manifest and plugins");
  if (processes > 0) overrides.push_back("distributed.processes=" + std::to_string(processes));
  if (max_restarts_option >= 0)
    overrides.push_back("distributed.max_restarts=" + std::to_string(max_restarts_option));
  Manifest manifest = load_manifest(manifest_file, overrides, PluginSearchPath::from_environment());
  spdlog::set_level(spdlog_level(manifest.run.log_level));
  const std::optional<DistEnv> launched = detect_launcher(process_environment());
  // One run directory, one run: a directory another run holds refuses this
  // one at once, before anything is loaded or written. The run's top process
  // holds it (this one, or the supervisor for all its workers; under an
  // external launcher, rank 0); a directory not made yet is locked when it is
  // (util/run_dir_lock.hpp).
  const bool run_dir_locked = (!launched || (launched->launcher != "kiln" && launched->rank == 0)) &&
                              lock_existing_run_dir(manifest.run.dir);
  // Every plugin is checked here, once, before any worker starts.
  Loader loader;
  RunPlugins plugins = load_plugins(manifest, command, loader);
  // A logger's server (MLflow) is checked once, by the run's top process,
  // before any worker starts: bad credentials or address exit 2 here.
  if ((!launched || (launched->launcher != "kiln" && launched->rank == 0)) && command != Command::predict)
    check_loggers(manifest.logging, manifest.run.dir);
  // Start-up in steps, since the process started (the first training step's
  // line is the trainer's): bench/README.md, "Start-up".
  spdlog::debug("start-up: main() reached at {:.2f} s (LibTorch's libraries loaded and initialised), "
                "manifest and plugins loaded at {:.2f} s; peak resident memory {} MB",
                main_reached_s, seconds_since_start(), peak_resident_mb());
  // A restarted worker of kiln's own launch resumes where its supervisor says.
  const char* restart_from = std::getenv(kResumeFromVariable);
  const bool restarted = launched && launched->launcher == "kiln" && restart_from != nullptr && *restart_from != '\0';
  const std::optional<std::filesystem::path> resume_file =
      restarted ? resume_checkpoint(restart_from, manifest, command) : resume_checkpoint(resume, manifest, command);
  const int max_restarts = command == Command::fit ? static_cast<int>(manifest.distributed.max_restarts) : 0;
  if (max_restarts > 0 && launched && launched->launcher != "kiln" && launched->rank == 0)
    spdlog::warn("distributed.max_restarts restarts kiln's own workers; under {} it does nothing: use the launcher's "
                 "restarts (torchrun --max-restarts, a SLURM requeue) with --resume auto",
                 launched->launcher);

  // The device, decided before any worker starts or anything is written: a
  // supervisor checks for all its ranks (each then takes its own), a
  // launched rank for itself.
  manifest.run.device = choose_device(
      manifest.run.device, manifest.trainer.precision, manifest.distributed.backend, launched ? launched->local_rank : 0,
      launched ? launched->local_world_size : manifest.distributed.processes, cuda_facts(), manifest.file.string());
  // Restarts need a process that outlives the workers: one worker is
  // supervised too when they are asked for.
  if (!launched && (manifest.distributed.processes > 1 || max_restarts > 0))
    return supervise_workers(manifest, argv, run_dir_locked, signal, max_restarts, resume_file);
  if (launched && launched->world_size > 1) {
    // Lightning prints from rank 0; other ranks say only what is wrong.
    spdlog::set_pattern(fmt::format("[%H:%M:%S] [rank {}] %^%l%$ %v", launched->rank));
    if (launched->rank != 0 && manifest.run.log_level != LogLevel::debug) spdlog::set_level(spdlog::level::warn);
  }
  const RunOutcome outcome =
      run(manifest, command, std::move(plugins), signal, launched ? &*launched : nullptr, resume_file, &heartbeat);
  return finish_run(outcome, heartbeat);
}

}  // namespace kiln
