// Where this process sits in a distributed run, read from the environment an
// external launcher sets (torchrun/TorchElastic, SLURM, Open MPI). When no
// launcher is present, kiln launches workers itself and hands each its place
// through the torchrun variables. No LibTorch here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kiln {

struct DistEnv {
  std::string launcher;          // "torchrun", "slurm", "openmpi" or "kiln" (kiln's own workers)
  int64_t rank = 0;
  int64_t local_rank = 0;
  int64_t world_size = 1;
  int64_t local_world_size = 1;
  int64_t node_rank = 0;
  std::string master_addr;       // where rank 0's TCPStore listens
  int64_t master_port = 0;
  std::string run_id;            // TORCHELASTIC_RUN_ID / SLURM_JOB_ID, if any
  // torchrun's agent serves the store on MASTER_PORT itself
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank is its client, under the
  // agent's prefix for this restart attempt (TORCHELASTIC_RESTART_COUNT).
  bool agent_store = false;
  int64_t restart_count = 0;
  // Where torchrun reads a failed worker's error (TORCHELASTIC_ERROR_FILE).
  std::string error_file;
};

// Looks a variable up; returns nullopt when unset. Tests pass a table.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

// The launcher's view of this process, or nullopt when no launcher variables
// are set (kiln then launches its own workers). Throws InputError with one
// line naming the variable when a variable is missing, not an integer, out of
// range, or contradicts another (e.g. RANK >= WORLD_SIZE).
std::optional<DistEnv> detect_launcher(const EnvLookup& env);

// The first host of a SLURM node list: "node[03-05,07],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace kiln
