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
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "config/manifest.hpp"
#include "ckpt/checkpoint_file.hpp"
#include "ckpt/run_state.hpp"
#include "dist/launch_env.hpp"
#include "dist/supervisor.hpp"
#include "plugin/loader.hpp"
#include "train/trainer.hpp"
#include "util/errors.hpp"

namespace {

// Turns SIGINT/SIGTERM into a flag the loop checks at step boundaries, so
// cleanup runs on the main thread. A second signal exits at once. The signals
// are blocked in every thread and taken here with sigtimedwait, which avoids
// async-signal-safety rules and global state.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);  // a preemption notice, when the manifest says so
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any other thread exists
    thread_ = std::thread([this] { watch(); });
  }
  ~SignalWatcher() {
    done_ = true;
    thread_.join();
  }
  const std::atomic<int>* signal() const { return &signal_; }

 private:
  void watch() {
    const timespec tick{0, 100'000'000};
    while (!done_) {
      const int s = sigtimedwait(&set_, nullptr, &tick);
      if (s <= 0) continue;
      if (signal_.exchange(s) != 0) {
        std::fputs("kiln: second signal, exiting without cleanup\n", stderr);
        _exit(kiln::kExitInterrupted);
      }
      std::fprintf(stderr, "\nkiln: %s received; stopping after the current step (send again to exit now)\n",
                   s == SIGTERM ? "SIGTERM" : s == SIGUSR1 ? "SIGUSR1" : "SIGINT");
    }
  }
  sigset_t set_;
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

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
            << "  position:      epoch " << meta.position.epoch << ", batch " << meta.position.next_batch << "\n"
            << "  global step:   " << meta.position.global_step << "\n";
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
    return kiln::kExitOk;
  }
  std::cout << "plugin library " << std::filesystem::absolute(path).string() << "\n";
  for (const auto& report : loader.inspect(path)) {
    std::cout << "\n";
    print_report(report, "");
  }
  return kiln::kExitOk;
}

int run_command(kiln::Command command, const std::string& manifest_file, std::vector<std::string> overrides,
                int processes, const std::string& resume, const std::vector<std::string>& argv,
                const std::atomic<int>* signal) {
  if (processes > 0) overrides.push_back("distributed.processes=" + std::to_string(processes));
  const kiln::Manifest manifest =
      kiln::load_manifest(manifest_file, overrides, kiln::PluginSearchPath::from_environment());
  spdlog::set_level(spdlog::level::from_str(manifest.run.log_level));
  // Every plugin is checked here, once, before any worker starts.
  kiln::Loader loader;
  kiln::RunPlugins plugins = kiln::load_plugins(manifest, command, loader);
  std::optional<std::filesystem::path> resume_file;
  if (!resume.empty()) {
    resume_file = kiln::resolve_resume(resume, manifest.checkpoint.dir, manifest.checkpoint.monitor,
                                       manifest.checkpoint.mode);
  }

  const std::optional<kiln::DistEnv> launched = kiln::detect_launcher(kiln::process_environment());
  if (!launched && manifest.distributed.processes > 1) {
    kiln::SupervisorOptions options;
    options.processes = static_cast<int>(manifest.distributed.processes);
    options.argv = argv;
    options.master_addr = manifest.distributed.master_addr;
    options.master_port = static_cast<int>(manifest.distributed.master_port);
    // A worker blocked on a stopped peer fails its collective after the
    // timeout; a stopped worker itself is caught by its silent heartbeat.
    // A beat comes every second from a thread of its own, so only a stopped or
    // frozen process misses them: half the collective timeout (2-10 s) lets
    // the supervisor name it before its peers' collectives time out.
    const double beat_s = std::clamp(manifest.distributed.timeout_s / 2, 2.0, 10.0);
    options.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(beat_s * 1000));
    const kiln::SupervisorResult result = kiln::supervise(options, signal);
    if (result.exit_code == kiln::kExitPreempted)
      std::cerr << "kiln: " << result.report << std::endl;
    else if (result.exit_code != 0)
      std::cerr << "kiln: error: " << result.report << std::endl;
    return result.exit_code;
  }
  if (launched && launched->world_size > 1) {
    // Lightning prints from rank 0; other ranks say only what is wrong.
    spdlog::set_pattern(fmt::format("[%H:%M:%S] [rank {}] %^%l%$ %v", launched->rank));
    if (launched->rank != 0 && manifest.run.log_level != "debug") spdlog::set_level(spdlog::level::warn);
  }
  kiln::Heartbeat heartbeat;  // evidence of life for kiln's supervisor, if it started us
  const kiln::RunOutcome outcome =
      kiln::run(manifest, command, std::move(plugins), signal, launched ? &*launched : nullptr, resume_file);
  if (!outcome.failure) return kiln::kExitOk;
  const bool preempted = outcome.failure->reason == KILN_FAILURE_PREEMPTED;
  std::cerr << (preempted ? "kiln: " : "kiln: error: ") << outcome.failure->report << std::endl;
  heartbeat.report_failure(outcome.failure->reason != KILN_FAILURE_PEER_FAILED, outcome.failure->report);
  switch (outcome.failure->reason) {
    case KILN_FAILURE_INTERRUPTED: return kiln::kExitInterrupted;
    case KILN_FAILURE_PREEMPTED: return kiln::kExitPreempted;
    default: return outcome.failure->bad_input ? kiln::kExitBadInput : kiln::kExitFailure;
  }
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

int main(int argc, char** argv) {
  tune_allocator();
  SignalWatcher signals;
  CLI::App app{"kiln — a training runtime for LibTorch plugins", "kiln"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION + " (ABI " +
                                        std::to_string(KILN_ABI_VERSION_MAJOR) + "." +
                                        std::to_string(KILN_ABI_VERSION_MINOR) + ", LibTorch " +
                                        kiln::host_torch_version() + ")");
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));

  std::string manifest;
  std::vector<std::string> overrides;
  int processes = 0;
  std::string resume;
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
  std::vector<std::pair<CLI::App*, kiln::Command>> commands;
  for (const Spec& s : specs) {
    CLI::App* sub = app.add_subcommand(s.name, s.help);
    sub->add_option("manifest", manifest, "the run's TOML manifest")->required();
    sub->add_option("--set", overrides, "override a manifest key, e.g. --set trainer.max_epochs=3")
        ->take_all()
        ->allow_extra_args(false);
    sub->add_option("--processes,-n", processes,
                    "start this many worker processes on this machine (overrides distributed.processes)")
        ->check(CLI::PositiveNumber);
    if (s.command == kiln::Command::fit)
      sub->add_option("--resume", resume, "continue from a checkpoint: a file, `last` or `best`");
    else
      sub->add_option("--ckpt", resume, "evaluate the weights of a checkpoint: a file, `last` or `best`");
    commands.emplace_back(sub, s.command);
  }
  std::string target;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "describe a manifest's plugins, a plugin .so, or check a checkpoint (.ckpt)");
  inspect_cmd->add_option("target", target, "a manifest (.toml), a plugin shared object or a checkpoint (.ckpt)")
      ->required();
  inspect_cmd->add_option("--set", overrides, "override a manifest key")->allow_extra_args(false);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kiln::kExitBadInput;
  }
  configure_logging(log_level);

  try {
    if (inspect_cmd->parsed()) return inspect(target, overrides);
    for (const auto& [sub, command] : commands)
      if (sub->parsed())
        return run_command(command, manifest, overrides, processes, resume,
                           std::vector<std::string>(argv, argv + argc), signals.signal());
  } catch (const kiln::InputError& e) {
    std::cerr << "kiln: error: " << e.what() << std::endl;
    return kiln::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "kiln: error: " << e.what() << std::endl;
    return kiln::kExitFailure;
  }
  return kiln::kExitBadInput;
}
