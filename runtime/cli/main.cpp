// The `kiln` executable: parses the command line (cli/command_line), then
// hands over to the command: fit, validate, test or predict
// (cli/run_command), inspect (cli/inspect_command), export, or
// manifest-reference. Exit codes: 0 success, 1 the run failed, 2 bad input
// (nothing ran, nothing written), 130 interrupted.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/command_line.hpp"
#include "cli/inspect_command.hpp"
#include "cli/run_command.hpp"
#include "ckpt/weights_export.hpp"
#include "config/manifest_reference.hpp"
#include "distributed/heartbeat.hpp"
#include "distributed/launcher_error_file.hpp"
#include "metrics/mlflow_logger.hpp"
#include "util/errors.hpp"
#include "util/process_info.hpp"
#include "util/signal_watcher.hpp"

namespace {

void configure_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("kiln");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

// `kiln export`: a checkpoint's weights for other tools (ckpt/weights_export.hpp).
int export_command(kiln::CommandLine& cli) {
  cli.export_request.checkpoint = cli.export_checkpoint;
  if (!cli.export_output.empty()) cli.export_request.output = cli.export_output;
  const kiln::ExportResult result = kiln::export_weights(cli.export_request);
  std::cout << "exported " << result.tensors << (result.averaged ? " averaged" : "") << " tensors (" << result.bytes
            << " bytes) to " << result.file.string() << "\n";
  return kiln::kExitOk;
}

// The command the line names, run. Throws what the command throws.
int run_parsed(kiln::CommandLine& cli, const std::vector<std::string>& argv, kiln::SignalWatcher& signals,
               kiln::Heartbeat& heartbeat, double main_reached_s) {
  if (cli.inspect_cmd->parsed()) return kiln::inspect_command(cli.target, cli.overrides);
  if (cli.export_cmd->parsed()) return export_command(cli);
  if (cli.mlflow_sync_cmd->parsed()) return kiln::mlflow_sync(cli.sync_dir, cli.sync_timeout_s);
  if (cli.reference_cmd->parsed()) {
    std::cout << kiln::manifest_reference_markdown() << std::flush;
    return kiln::kExitOk;
  }
  // A --log-level given on the command line wins over the manifest's
  // run.log_level (which otherwise sets the level once it is read).
  if (cli.app.count("--log-level") > 0) cli.overrides.push_back("run.log_level=" + cli.log_level);
  for (const auto& [sub, command] : cli.commands)
    if (sub->parsed()) {
      const int code = kiln::run_command(command, cli.manifest, cli.overrides, cli.processes, cli.max_restarts,
                                         cli.resume, argv, signals.signal(), heartbeat, main_reached_s);
      if (code == kiln::kExitOk) heartbeat.done();
      return code;
    }
  return kiln::kExitBadInput;
}

}  // namespace

// SIGINT, SIGTERM and SIGUSR1 blocked from the first code of kiln's that
// runs: the executable's .preinit_array, which the dynamic loader calls
// after relocating the libraries (~30 ms) and before their static
// initialisers (LibTorch registers its operators: ~0.3 s, seconds on a
// loaded node). A signal sent meanwhile (SLURM's --signal=USR1@N to a job
// that has just started, torchrun or srun forwarding a Ctrl-C) stays pending
// until SignalWatcher, first thing in main(), takes it, instead of killing
// kiln by its default action before it can stop as asked. kiln's own
// launcher keeps them blocked across exec for its workers (distributed/
// supervisor.cpp); this does the same under any other launcher.
static void block_watched_signals_at_start(int, char**, char**) {
  sigset_t set;
  sigemptyset(&set);
  for (const int s : kiln::SignalWatcher::kWatched) sigaddset(&set, s);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}
__attribute__((section(".preinit_array"), used)) static void (*const kiln_block_watched_signals)(int, char**, char**) =
    block_watched_signals_at_start;

// Batches are allocated on prefetch threads and freed on the main thread.
// With glibc's defaults every ~400 KB batch tensor is its own mmap, and each
// munmap in a multi-threaded process costs a TLB shoot-down on every core:
// mlp256 ran ~40 % slower than a single-threaded loop (bench/README.md).
// Serving them from the heap, and not trimming it after every free, removes
// that. Set before anything allocates in earnest; MALLOC_* variables still win.
void tune_allocator() {
#ifdef __GLIBC__
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

// Everything of main() but the end: its objects (signal watcher, heartbeat,
// loader, run) are all destroyed when it returns.
static int kiln_main(int argc, char** argv, double main_reached_s) {
  kiln::SignalWatcher signals;  // first: before any other thread, and SIGPIPE ignored
  // A worker of kiln's supervisor beats from here on: loading LibTorch's
  // libraries is over, loading plugins (possibly slow) is not yet begun.
  kiln::Heartbeat heartbeat;
  signals.announce_to(heartbeat.fd());
  kiln::CommandLine cli;
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return kiln::command_line_error(e, cli, argc, argv);
  }
  configure_logging(cli.log_level);

  // Failures before the plugin session (the manifest, plugin loading, the
  // rendezvous) reach the supervisor the same way as those inside it.
  auto failed = [&](const std::exception& e, bool root, int code) {
    spdlog::debug("{}", e.what());  // with its backtrace, if it has one
    const std::string line = kiln::one_line(e.what());
    std::cerr << "kiln: error: " << line << std::endl;
    heartbeat.report_failure(root, line);
    kiln::write_launcher_error_file(line, root);
    return code;
  };
  try {
    return run_parsed(cli, std::vector<std::string>(argv, argv + argc), signals, heartbeat, main_reached_s);
  } catch (const kiln::InputError& e) {
    return failed(e, true, kiln::kExitBadInput);
  } catch (const kiln::PeerFailure& e) {
    return failed(e, false, kiln::kExitFailure);
  } catch (const kiln::Interrupted& e) {
    // A signal before the plugin session (a rank in the rendezvous): never
    // the cause, and an interruption still exits 130.
    return failed(e, false, kiln::kExitInterrupted);
  } catch (const std::exception& e) {
    return failed(e, true, kiln::kExitFailure);
  }
}

// Sanitizer builds end the normal way: LeakSanitizer reports from an exit handler.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KILN_EXIT_WITH_STATIC_DESTRUCTORS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KILN_EXIT_WITH_STATIC_DESTRUCTORS 1
#endif
#endif

int main(int argc, char** argv) {
  tune_allocator();
  const double main_reached_s = kiln::seconds_since_start();
  const int code = kiln_main(argc, argv, main_reached_s);
  // Every object of kiln_main is gone: files closed (and the durable ones
  // fsync'ed), threads joined, plugins unloaded. What exit() would still run
  // is the static destructors of LibTorch and the ~290 libraries it loads,
  // which deregister every operator one by one: ~0.2 s of a short command
  // such as `kiln inspect` (bench/README.md, "Start-up"), for nothing a
  // process that ends needs. Streams are flushed here instead.
  std::cout.flush();
  std::cerr.flush();
  spdlog::shutdown();
  std::fflush(nullptr);
#ifndef KILN_EXIT_WITH_STATIC_DESTRUCTORS
  ::_exit(code);
#endif
  return code;
}
