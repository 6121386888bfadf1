// `kiln fit | validate | test | predict`: the manifest and plugins loaded
// and checked, the checkpoint to resume resolved, the device chosen, then
// the run, in this process or under kiln's supervisor; a failed run's report
// printed, and told to the supervisor.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "train/command.hpp"

namespace kiln {

class Heartbeat;

// The exit code (util/errors.hpp). `overrides`: --set's; `processes`,
// `max_restarts_option` (-1: not given) and `resume` (--resume or --ckpt):
// the command line's. `argv`: the whole command line, which each worker of
// kiln's supervisor runs again.
int run_command(Command command, const std::string& manifest_file, std::vector<std::string> overrides,
                int processes, int max_restarts_option, const std::string& resume, const std::vector<std::string>& argv,
                const std::atomic<int>* signal, Heartbeat& heartbeat, double main_reached_s);

}  // namespace kiln
