// Runs one command (fit, validate, test, predict) of a manifest: loads and
// checks the plugins, then drives the loop inside the plugin lifecycle.
#pragma once

#include <atomic>
#include <map>
#include <optional>
#include <string>

#include "config/manifest.hpp"
#include "distributed/launch_env.hpp"
#include "plugin/loader.hpp"
#include "train/command.hpp"
#include "train/session.hpp"

namespace kiln {

class Heartbeat;


// The plugins of a manifest, loaded and validated, nothing created yet.
struct RunPlugins {
  std::vector<LoadedPlugin> callbacks;
  LoadedPlugin data;
  LoadedPlugin model;
};

// Throws InputError (exit 2) for any plugin the loader refuses, or a model
// that lacks the hook `command` needs.
RunPlugins load_plugins(const Manifest& manifest, Command command, Loader& loader);

struct RunOutcome {
  std::optional<Failure> failure;
  std::map<std::string, double> metrics;  // latest reduced values
  // A plugin call abandoned on a failure is still running on a host thread:
  // the process must end with _exit, not run static destructors under it.
  bool calls_abandoned = false;
};

// `signal` is set (to the signal number) by the CLI when SIGINT/SIGTERM
// arrives; the loop checks it at every step boundary. `dist` is this
// process's place in a distributed run (nullptr: a single process); with a
// world size above 1 the process group is created before any plugin.
// `resume` is a checkpoint, already resolved: fit continues from it; the
// other commands evaluate its weights.
// `heartbeat` (may be null) is told the run's phases and watches the hooks
// the main thread is inside, for kiln's supervisor.
RunOutcome run(const Manifest& manifest, Command command, RunPlugins plugins, const std::atomic<int>* signal,
               const DistEnv* dist, const std::optional<std::filesystem::path>& resume = std::nullopt,
               Heartbeat* heartbeat = nullptr);

}  // namespace kiln
