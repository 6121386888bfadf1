// One run of a command, wired from its parts (train/run/): the process
// group, the plugins' services, the metrics, the event fan-out, the run
// control and the checkpoints, handed to the loops (train/loops) as the
// parts they call.
#pragma once

#include <atomic>
#include <filesystem>
#include <optional>

#include "train/run/trainer.hpp"

namespace kiln {

RunOutcome run_session(const Manifest& manifest, Command command, RunPlugins plugins, const std::atomic<int>* signal,
                       const DistEnv* dist, const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat);

}  // namespace kiln
