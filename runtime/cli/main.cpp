// The `kiln` executable: parses the command line, then hands over to the
// trainer. Exit codes: 0 success, 1 the run failed, 2 bad input (nothing
// ran, nothing written), 130 interrupted.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "config/manifest.hpp"
#include "device/cuda_facts.hpp"
#include "config/manifest_reference.hpp"
#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_dir.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/weights_export.hpp"
#include "distributed/launch_env.hpp"
#include "distributed/heartbeat.hpp"
#include "distributed/restarts.hpp"
#include "distributed/supervisor.hpp"
#include "plugin/loader.hpp"
#include "train/data_summary.hpp"
#include "train/model_parameters.hpp"
#include "train/trainer.hpp"
#include "util/errors.hpp"
#include "util/process_info.hpp"
#include "util/run_dir_lock.hpp"
#include "util/signal_watcher.hpp"

namespace {

spdlog::level::level_enum spdlog_level(kiln::LogLevel level) {
  switch (level) {
    case kiln::LogLevel::debug: return spdlog::level::debug;
    case kiln::LogLevel::info: return spdlog::level::info;
    case kiln::LogLevel::warn: return spdlog::level::warn;
    case kiln::LogLevel::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

void configure_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("kiln");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

void print_report(const kiln::PluginReport& r, const std::string& slot) {
  std::cout << (slot.empty() ? "" : "[" + slot + "] ") << r.id << "\n"
            << "  name:          " << r.name << (r.version.empty() ? "" : " " + r.version) << "\n";
  if (!r.description.empty()) std::cout << "  description:   " << r.description << "\n";
  std::cout << "  kind:          " << r.kind << "\n"
            << "  ABI:           " << r.abi_major << "." << r.abi_minor << "\n"
            << "  LibTorch:      " << r.torch_version << "\n";
  if (r.flags & KILN_DATA_CONCURRENT_GET_BATCH) std::cout << "  flags:         concurrent get_batch\n";
  std::cout << "  hooks:        ";
  for (const auto& h : r.hooks) std::cout << " " << h;
  std::cout << "\n";
}

// A checkpoint: validated (checksum included), then its metadata. Exit 2
// when it is not a usable checkpoint.
int inspect_checkpoint(const std::filesystem::path& path) {
  if (auto problem = kiln::CheckpointFile::check(path)) throw kiln::InputError(*problem);
  const kiln::CheckpointFile file = kiln::CheckpointFile::read(path);
  const kiln::CheckpointMeta meta = kiln::read_meta(file);
  size_t params = 0, optimizer = 0, plugins = 0;
  for (const auto& name : file.names()) {
    params += name.rfind("param/", 0) == 0;
    optimizer += name.rfind("optim/", 0) == 0;
    plugins += name.rfind("plugin/", 0) == 0;
  }
  std::cout << "checkpoint " << std::filesystem::absolute(path).string() << " (valid, checksum verified)\n"
            << "  written by:    kiln " << meta.kiln_version << ", format " << kiln::kCheckpointFormat << "\n"
            << "  position:      epoch " << meta.position.epoch << ", batch " << meta.position.next_batch;
  if (meta.position.next_sample >= 0) std::cout << ", sample " << meta.position.next_sample << " of its order";
  std::cout << "\n  global step:   " << meta.position.global_step << "\n";
  if (meta.saved_by.world_size > 0)
    std::cout << "  saved by:      " << meta.saved_by.world_size << " process" << (meta.saved_by.world_size == 1 ? "" : "es")
              << ", batch size " << meta.saved_by.batch_size << "\n";
  if (!meta.monitor.empty())
    std::cout << "  monitor:       " << meta.monitor << " = "
              << (meta.monitored ? std::to_string(*meta.monitored) : std::string("(none)")) << "\n";
  std::cout << "  sections:      " << params << " parameters, " << optimizer << " optimizer, " << plugins
            << " plugin state, " << file.names().size() << " in all\n";
  return kiln::kExitOk;
}

int inspect(const std::string& target, const std::vector<std::string>& overrides) {
  kiln::Loader loader;
  const std::filesystem::path path(target);
  if (path.extension() == ".ckpt") return inspect_checkpoint(path);
  if (path.extension() == ".toml") {
    const kiln::Manifest m = kiln::load_manifest(path, overrides, kiln::PluginSearchPath::from_environment());
    std::cout << "manifest " << m.file.string() << "\n  run dir: " << m.run.dir.string() << "\n";
    const auto plugins = kiln::load_plugins(m, kiln::Command::fit, loader);
    auto show = [&](const kiln::LoadedPlugin& p) {
      const kiln_entry entry{sizeof(kiln_entry), KILN_ABI_VERSION_MAJOR, KILN_ABI_VERSION_MINOR, 0, nullptr};
      auto report = kiln::describe_plugin(*p.descriptor, entry);
      std::cout << "\n";
      print_report(report, p.slot);
      std::cout << "  file:          " << p.path.string() << "\n";
    };
    show(plugins.model);
    show(plugins.data);
    for (const auto& c : plugins.callbacks) show(c);
    // Lightning's summary, from the model the manifest configures.
    std::cout << "\nmodel summary (" << plugins.model.id() << ", as configured by the manifest):\n";
    for (const std::string& line : kiln::model_summary(kiln::inspect_model_parameters(plugins.model, m.model.config_toml)))
      std::cout << "  " << line << "\n";
    // The data it reads: each split's size, a sample's tensors, its class list.
    std::cout << "\ndata (" << plugins.data.id() << ", as configured by the manifest):\n";
    for (const std::string& line : kiln::inspect_data(plugins.data, m.data.config_toml)) std::cout << "  " << line << "\n";
    return kiln::kExitOk;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw kiln::InputError(target + " is a directory: inspect takes a manifest (.toml), a plugin shared object or a "
                                    "checkpoint (.ckpt)");
  // Loaded before anything is printed: a target that is none of the three
  // gets the one error line only.
  const auto reports = loader.inspect(path);
  std::cout << "plugin library " << std::filesystem::absolute(path).string() << "\n";
  for (const auto& report : reports) {
    std::cout << "\n";
    print_report(report, "");
  }
  return kiln::kExitOk;
}

// The checkpoint --resume (or --ckpt) names, resolved: a file, `last`,
// `best`, or (fit only) `auto`: the newest committed checkpoint if there is
// one, else a fresh start, logged either way.
std::optional<std::filesystem::path> resume_checkpoint(const std::string& resume, const kiln::Manifest& manifest,
                                                       kiln::Command command) {
  if (resume.empty()) return std::nullopt;
  const kiln::RetentionPolicy policy{manifest.checkpoint.monitor, manifest.checkpoint.mode, 1};
  if (resume == "auto") {
    if (command != kiln::Command::fit)
      throw kiln::InputError("--ckpt auto: `auto` is fit's --resume (continue if a checkpoint exists, else start "
                             "fresh); evaluating needs weights: name a file, `last` or `best`");
    const std::optional<kiln::CheckpointInfo> newest = kiln::newest_checkpoint(manifest.checkpoint.dir, policy);
    if (newest)
      spdlog::info("--resume auto: resuming from {} (step {})", newest->path.string(), newest->global_step);
    else
      spdlog::info("--resume auto: no checkpoint in {}; a fresh start", manifest.checkpoint.dir.string());
    return newest ? std::optional(newest->path) : std::nullopt;
  }
  const std::string option = command == kiln::Command::fit ? "--resume" : "--ckpt";
  std::filesystem::path file = kiln::resolve_resume(resume, manifest.checkpoint.dir, policy, option);
  spdlog::debug("start-up: {} {} resolved to {} at {:.2f} s", option, resume, file.string(), kiln::seconds_since_start());
  return file;
}

// Several processes on this machine: kiln's supervisor starts the workers
// (each runs this command line again, as a launched rank) and watches them.
// With max_restarts, a failed run starts again from its newest committed
// checkpoint (distributed/restarts.hpp).
int supervise_workers(const kiln::Manifest& manifest, const std::vector<std::string>& argv, bool run_dir_locked,
                      const std::atomic<int>* signal, int max_restarts,
                      const std::optional<std::filesystem::path>& resume_file) {
  kiln::SupervisorOptions options;
  options.processes = static_cast<int>(manifest.distributed.processes);
  options.argv = argv;
  options.master_addr = manifest.distributed.master_addr;
  options.master_port = static_cast<int>(manifest.distributed.master_port);
  if (run_dir_locked) options.env.emplace_back(kiln::kRunDirLockedVariable, "1");
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
  kiln::RestartPlan plan;
  plan.max_restarts = max_restarts;
  plan.first_resume = resume_file;
  const kiln::RetentionPolicy policy{manifest.checkpoint.monitor, manifest.checkpoint.mode, 1};
  plan.newest = [dir = manifest.checkpoint.dir, policy]() -> std::optional<kiln::CommittedCheckpoint> {
    const auto newest = kiln::newest_checkpoint(dir, policy);
    if (!newest) return std::nullopt;
    return kiln::CommittedCheckpoint{newest->path, newest->global_step};
  };
  const kiln::SupervisorResult result = kiln::supervise_with_restarts(options, signal, plan);
  if (result.exit_code == kiln::kExitPreempted)
    std::cerr << "kiln: " << result.report << std::endl;
  else if (result.exit_code != 0)
    std::cerr << "kiln: error: " << result.report << std::endl;
  return result.exit_code;
}

// The exit code of a run that has ended, its failure (if any) reported.
int finish_run(const kiln::RunOutcome& outcome, kiln::Heartbeat& heartbeat) {
  if (!outcome.failure) return kiln::kExitOk;
  const bool preempted = outcome.failure->reason == KILN_FAILURE_PREEMPTED;
  std::cerr << (preempted ? "kiln: " : "kiln: error: ") << outcome.failure->report << std::endl;
  // An interruption is the supervisor's own SIGTERM, or a signal the
  // supervisor saw too: never the cause it reports.
  heartbeat.report_failure(outcome.failure->reason != KILN_FAILURE_PEER_FAILED &&
                               outcome.failure->reason != KILN_FAILURE_INTERRUPTED,
                           outcome.failure->report);
  int code = outcome.failure->bad_input ? kiln::kExitBadInput : kiln::kExitFailure;
  if (outcome.failure->reason == KILN_FAILURE_INTERRUPTED) code = kiln::kExitInterrupted;
  if (outcome.failure->reason == KILN_FAILURE_PREEMPTED) code = kiln::kExitPreempted;
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

// fit, validate, test or predict: the manifest and plugins loaded and
// checked, then the run, in this process or under kiln's supervisor.
int run_command(kiln::Command command, const std::string& manifest_file, std::vector<std::string> overrides,
                int processes, int max_restarts_option, const std::string& resume, const std::vector<std::string>& argv,
                const std::atomic<int>* signal, kiln::Heartbeat& heartbeat, double main_reached_s) {
  heartbeat.phase("loading the manifest and plugins");
  if (processes > 0) overrides.push_back("distributed.processes=" + std::to_string(processes));
  if (max_restarts_option >= 0)
    overrides.push_back("distributed.max_restarts=" + std::to_string(max_restarts_option));
  kiln::Manifest manifest = kiln::load_manifest(manifest_file, overrides, kiln::PluginSearchPath::from_environment());
  spdlog::set_level(spdlog_level(manifest.run.log_level));
  const std::optional<kiln::DistEnv> launched = kiln::detect_launcher(kiln::process_environment());
  // One run directory, one run: a directory another run holds refuses this
  // one at once, before anything is loaded or written. The run's top process
  // holds it (this one, or the supervisor for all its workers; under an
  // external launcher, rank 0); a directory not made yet is locked when it is
  // (util/run_dir_lock.hpp).
  const bool run_dir_locked = (!launched || (launched->launcher != "kiln" && launched->rank == 0)) &&
                              kiln::lock_existing_run_dir(manifest.run.dir);
  // Every plugin is checked here, once, before any worker starts.
  kiln::Loader loader;
  kiln::RunPlugins plugins = kiln::load_plugins(manifest, command, loader);
  // Start-up in steps, since the process started (the first training step's
  // line is the trainer's): bench/README.md, "Start-up".
  spdlog::debug("start-up: main() reached at {:.2f} s (LibTorch's libraries loaded and initialised), "
                "manifest and plugins loaded at {:.2f} s", main_reached_s, kiln::seconds_since_start());
  // A restarted worker of kiln's own launch resumes where its supervisor says.
  const char* restart_from = std::getenv(kiln::kResumeFromVariable);
  const bool restarted = launched && launched->launcher == "kiln" && restart_from != nullptr && *restart_from != '\0';
  const std::optional<std::filesystem::path> resume_file =
      restarted ? resume_checkpoint(restart_from, manifest, command) : resume_checkpoint(resume, manifest, command);
  const int max_restarts = command == kiln::Command::fit ? static_cast<int>(manifest.distributed.max_restarts) : 0;
  if (max_restarts > 0 && launched && launched->launcher != "kiln" && launched->rank == 0)
    spdlog::warn("distributed.max_restarts restarts kiln's own workers; under {} it does nothing: use the launcher's "
                 "restarts (torchrun --max-restarts, a SLURM requeue) with --resume auto",
                 launched->launcher);

  // The device, decided before any worker starts or anything is written: a
  // supervisor checks for all its ranks (each then takes its own), a
  // launched rank for itself.
  manifest.run.device = kiln::choose_device(
      manifest.run.device, manifest.trainer.precision, manifest.distributed.backend, launched ? launched->local_rank : 0,
      launched ? launched->local_world_size : manifest.distributed.processes, kiln::cuda_facts(), manifest.file.string());
  // Restarts need a process that outlives the workers: one worker is
  // supervised too when they are asked for.
  if (!launched && (manifest.distributed.processes > 1 || max_restarts > 0))
    return supervise_workers(manifest, argv, run_dir_locked, signal, max_restarts, resume_file);
  if (launched && launched->world_size > 1) {
    // Lightning prints from rank 0; other ranks say only what is wrong.
    spdlog::set_pattern(fmt::format("[%H:%M:%S] [rank {}] %^%l%$ %v", launched->rank));
    if (launched->rank != 0 && manifest.run.log_level != kiln::LogLevel::debug) spdlog::set_level(spdlog::level::warn);
  }
  const kiln::RunOutcome outcome = kiln::run(manifest, command, std::move(plugins), signal,
                                             launched ? &*launched : nullptr, resume_file, &heartbeat);
  return finish_run(outcome, heartbeat);
}

// The command line: the subcommands, and the values their options fill.
struct CommandLine {
  CLI::App app{"kiln — a training runtime for LibTorch plugins", "kiln"};
  std::string log_level = "info";
  // fit, validate, test and predict
  std::vector<std::pair<CLI::App*, kiln::Command>> commands;
  std::string manifest;
  std::vector<std::string> overrides;
  int processes = 0;
  int max_restarts = -1;  // -1: not given
  std::string resume;
  // inspect
  CLI::App* inspect_cmd = nullptr;
  std::string target;
  // export
  CLI::App* export_cmd = nullptr;
  kiln::ExportRequest export_request;
  std::string export_checkpoint, export_output;
  // manifest-reference
  CLI::App* reference_cmd = nullptr;

  CommandLine() {
    app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION + " (ABI " +
                                          std::to_string(KILN_ABI_VERSION_MAJOR) + "." +
                                          std::to_string(KILN_ABI_VERSION_MINOR) + ", LibTorch " +
                                          kiln::host_torch_version() + ")");
    app.require_subcommand(1);
    // --log-level after the command too (kiln fit run.toml --log-level debug).
    app.fallthrough();
    app.add_option("--log-level", log_level, "debug, info, warn or error")
        ->check(CLI::IsMember(kiln::option_names<kiln::LogLevel>()));
    add_run_commands();
    add_inspect();
    add_export();
    reference_cmd = app.add_subcommand(
        "manifest-reference", "print the reference of every manifest key (docs/manifest.md) as Markdown");
  }
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

 private:
  void add_run_commands() {
    struct Spec {
      const char* name;
      const char* help;
      kiln::Command command;
    };
    const Spec specs[] = {
        {"fit", "train (and validate) the model of a manifest", kiln::Command::fit},
        {"validate", "run the validation split once", kiln::Command::validate},
        {"test", "run the test split once", kiln::Command::test},
        {"predict", "write predictions of the predict split to <run dir>/predictions.pt", kiln::Command::predict},
    };
    for (const Spec& s : specs) {
      CLI::App* sub = app.add_subcommand(s.name, s.help);
      sub->add_option("manifest", manifest, "the run's TOML manifest")->required();
      sub->add_option("--set", overrides, "override a manifest key, e.g. --set trainer.max_epochs=3")
          ->take_all()
          ->allow_extra_args(false);
      sub->add_option("--processes,-n", processes,
                      "start this many worker processes on this machine (overrides distributed.processes)")
          ->check(CLI::Range(1, 4096));
      if (s.command == kiln::Command::fit) {
        sub->add_option("--resume", resume,
                        "continue from a checkpoint: a file, `last`, `best`, or `auto` (the newest if there is one, "
                        "else a fresh start: for torchrun restarts and requeued jobs)");
        sub->add_option("--max-restarts", max_restarts,
                        "after a worker fails, restart the workers from the newest committed checkpoint up to this "
                        "many times (overrides distributed.max_restarts)")
            ->check(CLI::NonNegativeNumber);
      } else
        sub->add_option("--ckpt", resume, "evaluate the weights of a checkpoint: a file, `last` or `best`");
      commands.emplace_back(sub, s.command);
    }
  }

  void add_inspect() {
    inspect_cmd =
        app.add_subcommand("inspect", "describe a manifest's plugins, a plugin .so, or check a checkpoint (.ckpt)");
    inspect_cmd->add_option("target", target, "a manifest (.toml), a plugin shared object or a checkpoint (.ckpt)")
        ->required();
    inspect_cmd->add_option("--set", overrides, "override a manifest key")->allow_extra_args(false);
  }

  void add_export() {
    export_cmd = app.add_subcommand(
        "export", "write a checkpoint's model weights for other tools: safetensors, or a torch.load-able .pt dict");
    export_cmd->add_option("checkpoint", export_checkpoint, "the checkpoint (.ckpt)")->required();
    export_cmd
        ->add_option("--format", export_request.format, "safetensors (default) or pt")
        // One validating transform (CLI11 runs transforms before checks, so
        // a check beside CheckedTransformer never sees a bad value): the
        // name to the enum's number, or the line a person reads.
        ->transform(CLI::Validator(
            [](std::string& v) -> std::string {
              if (v == "safetensors" || v == "pt") {
                const auto format = v == "pt" ? kiln::ExportFormat::pt : kiln::ExportFormat::safetensors;
                v = std::to_string(static_cast<int>(format));
                return "";
              }
              return "must be 'safetensors' or 'pt', not '" + v + "'";
            },
            "safetensors|pt"));
    export_cmd->add_option("-o,--output", export_output,
                           "the file to write (default: the checkpoint's name with .safetensors or .pt, beside it)");
    export_cmd->add_flag("--force", export_request.overwrite, "replace the output file if it exists");
    export_cmd->add_flag("--trained-weights", export_request.trained_weights,
                         "a checkpoint with averaged weights ([averaging]): write the trained weights instead");
  }
};

// An option another command or the whole program takes, given in the wrong
// place: what the user meant, rather than CLI11's "not expected".
std::string misplaced_option(int argc, char** argv) {
  if (argc < 2) return "";
  const std::string command = argv[1];
  const bool evaluation = command == "validate" || command == "test" || command == "predict";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string option = arg.substr(0, arg.find('='));
    if (evaluation && option == "--resume")
      return "kiln " + command + " takes the checkpoint to evaluate as --ckpt (a file, `last` or `best`); --resume is "
                                 "fit's";
    if (command == "fit" && (option == "--ckpt" || option == "--ckpt_path" || option == "--ckpt-path"))
      return "kiln fit continues from a checkpoint with --resume (a file, `last`, `best` or `auto`); " + option +
             " is not fit's";
  }
  return "";
}

// A command line CLI11 refused (or --help, --version): kiln's one line.
int command_line_error(const CLI::ParseError& e, CommandLine& cli, int argc, char** argv) {
  if (e.get_exit_code() == 0) return cli.app.exit(e);  // --help, --version
  // Bad command lines get kiln's one line too, naming what was wrong.
  std::string what = kiln::one_line(e.what());
  if (argc > 1 && argv[1][0] != '-' && cli.app.get_subcommands().empty())
    what = std::string("unknown command '") + argv[1] + "' (commands: fit, validate, test, predict, inspect, export, manifest-reference)";
  else if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::ExtrasError))
    if (const std::string hint = misplaced_option(argc, argv); !hint.empty()) what = hint;
  std::cerr << "kiln: error: " << what << " (see kiln --help)" << std::endl;
  return kiln::kExitBadInput;
}

int export_command(CommandLine& cli) {
  cli.export_request.checkpoint = cli.export_checkpoint;
  if (!cli.export_output.empty()) cli.export_request.output = cli.export_output;
  const kiln::ExportResult result = kiln::export_weights(cli.export_request);
  std::cout << "exported " << result.tensors << (result.averaged ? " averaged" : "") << " tensors (" << result.bytes
            << " bytes) to " << result.file.string() << "\n";
  return kiln::kExitOk;
}

// The command the line names, run. Throws what the command throws.
int run_parsed(CommandLine& cli, const std::vector<std::string>& argv, kiln::SignalWatcher& signals,
               kiln::Heartbeat& heartbeat, double main_reached_s) {
  if (cli.inspect_cmd->parsed()) return inspect(cli.target, cli.overrides);
  if (cli.export_cmd->parsed()) return export_command(cli);
  if (cli.reference_cmd->parsed()) {
    std::cout << kiln::manifest_reference_markdown() << std::flush;
    return kiln::kExitOk;
  }
  // A --log-level given on the command line wins over the manifest's
  // run.log_level (which otherwise sets the level once it is read).
  if (cli.app.count("--log-level") > 0) cli.overrides.push_back("run.log_level=" + cli.log_level);
  for (const auto& [sub, command] : cli.commands)
    if (sub->parsed()) {
      const int code = run_command(command, cli.manifest, cli.overrides, cli.processes, cli.max_restarts, cli.resume, argv,
                                   signals.signal(), heartbeat, main_reached_s);
      if (code == kiln::kExitOk) heartbeat.done();
      return code;
    }
  return kiln::kExitBadInput;
}

}  // namespace

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
  CommandLine cli;
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return command_line_error(e, cli, argc, argv);
  }
  configure_logging(cli.log_level);

  // Failures before the plugin session (the manifest, plugin loading, the
  // rendezvous) reach the supervisor the same way as those inside it.
  auto failed = [&](const std::exception& e, bool root, int code) {
    spdlog::debug("{}", e.what());  // with its backtrace, if it has one
    const std::string line = kiln::one_line(e.what());
    std::cerr << "kiln: error: " << line << std::endl;
    heartbeat.report_failure(root, line);
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
