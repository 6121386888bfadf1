#include "distributed/launch_env.hpp"

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "util/errors.hpp"

namespace kiln {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Env with(Env base, const Env& overrides) {
  for (const auto& [name, value] : overrides) base[name] = value;
  return base;
}

Env without(Env base, const std::vector<std::string>& names) {
  for (const std::string& name : names) base.erase(name);
  return base;
}

DistEnv dist(const std::string& launcher, int64_t rank, int64_t local_rank, int64_t world_size,
             int64_t local_world_size, int64_t node_rank, const std::string& master_addr, int64_t master_port,
             const std::string& run_id) {
  DistEnv d;
  d.launcher = launcher;
  d.rank = rank;
  d.local_rank = local_rank;
  d.world_size = world_size;
  d.local_world_size = local_world_size;
  d.node_rank = node_rank;
  d.master_addr = master_addr;
  d.master_port = master_port;
  d.run_id = run_id;
  return d;
}

// One row: an environment and either the DistEnv it gives, nullopt (no
// launcher), or an InputError whose message contains every fragment.
struct Case {
  std::string name;
  Env env;
  enum Kind { kOk, kNone, kError } kind = kNone;
  DistEnv expected;
  std::vector<std::string> fragments;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

Case ok(const std::string& name, const Env& env, const DistEnv& expected) {
  return {name, env, Case::kOk, expected, {}};
}
Case none(const std::string& name, const Env& env) { return {name, env, Case::kNone, {}, {}}; }
Case err(const std::string& name, const Env& env, const std::vector<std::string>& fragments) {
  return {name, env, Case::kError, {}, fragments};
}

// ----------------------------------------------------------- base tables --

// Node 1 of 2, four workers per node, this is worker 1 on it.
const Env kTorchrun = {
    {"RANK", "5"},          {"LOCAL_RANK", "1"},      {"WORLD_SIZE", "8"},     {"LOCAL_WORLD_SIZE", "4"},
    {"GROUP_RANK", "1"},    {"MASTER_ADDR", "host0"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "run42"},
};
const DistEnv kTorchrunExpected = dist("torchrun", 5, 1, 8, 4, 1, "host0", 29500, "run42");

const Env kSlurm = {
    {"SLURM_PROCID", "5"},          {"SLURM_LOCALID", "1"},           {"SLURM_NTASKS", "8"},
    {"SLURM_NODEID", "1"},          {"SLURM_NODELIST", "gpu[03-04]"}, {"SLURM_JOB_NODELIST", "gpu[03-04]"},
    {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_NNODES", "2"},
    {"SLURM_JOB_ID", "123456"},
};
// Port: 15000 + 123456 % 10000.
const DistEnv kSlurmExpected = dist("slurm", 5, 1, 8, 4, 1, "gpu03", 18456, "123456");

const Env kOmpi = {
    {"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"},       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"MASTER_ADDR", "host0"},
    {"MASTER_PORT", "29500"},
};
const DistEnv kOmpiExpected = dist("openmpi", 5, 1, 8, 4, 1, "host0", 29500, "");

const char* const kTorchrunHint = "torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

std::vector<Case> launcher_cases() {
  std::vector<Case> cases;
  auto add = [&cases](Case c) { cases.push_back(std::move(c)); };

  // ------------------------------------------------------------ no launcher
  add(none("empty_environment", {}));
  add(none("unrelated_variables", {{"HOME", "/root"}, {"PATH", "/usr/bin"}}));
  add(none("rendezvous_variables_alone", {{"MASTER_ADDR", "host0"}, {"MASTER_PORT", "29500"}}));
  add(none("salloc_shell_without_srun", {{"SLURM_JOB_ID", "77"}, {"SLURM_NODELIST", "n[1-2]"}, {"SLURM_NNODES", "2"}}));
  add(none("openmpi_size_without_rank", {{"OMPI_COMM_WORLD_SIZE", "4"}}));
  add(none("kiln_marker_not_1", {{"KILN_LAUNCHED_BY_KILN", "0"}}));
  add(none("slurm_variables_without_procid", without(kSlurm, {"SLURM_PROCID"})));

  // ---------------------------------------------------------------- torchrun
  add(ok("torchrun_full", kTorchrun, kTorchrunExpected));
  add(ok("torchrun_minimal_single_process",
         {{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}},
         dist("torchrun", 0, 0, 1, 1, 0, "127.0.0.1", 29500, "")));
  add(ok("torchrun_without_local_world_size_is_one_node",
         without(with(kTorchrun, {{"RANK", "6"}, {"LOCAL_RANK", "6"}}), {"LOCAL_WORLD_SIZE", "GROUP_RANK"}),
         dist("torchrun", 6, 6, 8, 8, 0, "host0", 29500, "run42")));
  add(ok("torchrun_group_rank_zero_without_local_world_size",
         without(with(kTorchrun, {{"GROUP_RANK", "0"}, {"RANK", "3"}}), {"LOCAL_WORLD_SIZE"}),
         dist("torchrun", 3, 1, 8, 8, 0, "host0", 29500, "run42")));
  add(ok("torchrun_node_rank_from_rank_without_group_rank", without(kTorchrun, {"GROUP_RANK"}), kTorchrunExpected));
  add(ok("torchrun_leading_zeros_are_decimal", with(kTorchrun, {{"RANK", "05"}, {"MASTER_PORT", "029500"}}),
         kTorchrunExpected));
  add(ok("torchrun_port_bounds_low", with(kTorchrun, {{"MASTER_PORT", "1"}}),
         dist("torchrun", 5, 1, 8, 4, 1, "host0", 1, "run42")));
  add(ok("torchrun_port_bounds_high", with(kTorchrun, {{"MASTER_PORT", "65535"}}),
         dist("torchrun", 5, 1, 8, 4, 1, "host0", 65535, "run42")));
  add(ok("torchrun_wins_over_slurm", with(kSlurm, with(kTorchrun, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})),
         kTorchrunExpected));
  add(ok("torchrun_wins_over_openmpi", with(with(kOmpi, {{"OMPI_COMM_WORLD_RANK", "0"}}), kTorchrun),
         kTorchrunExpected));
  add(ok("slurm_wins_over_openmpi", with(without(with(kOmpi, {{"OMPI_COMM_WORLD_RANK", "0"}}), {"MASTER_ADDR", "MASTER_PORT"}), kSlurm),
         kSlurmExpected));
  add(err("torchrun_wins_over_slurm_even_when_incomplete", with(kSlurm, {{"LOCAL_RANK", "0"}}),
          {"launcher environment (torchrun): RANK is not set; ", kTorchrunHint}));
  add(err("torchelastic_run_id_alone_means_torchrun", {{"TORCHELASTIC_RUN_ID", "abc"}},
          {"launcher environment (torchrun): RANK is not set"}));

  // -------------------------------------------------------------------- kiln
  add(ok("kiln_worker", with(kTorchrun, {{"KILN_LAUNCHED_BY_KILN", "1"}}),
         dist("kiln", 5, 1, 8, 4, 1, "host0", 29500, "run42")));
  add(ok("kiln_marker_other_value_is_torchrun", with(kTorchrun, {{"KILN_LAUNCHED_BY_KILN", "0"}}), kTorchrunExpected));
  add(ok("kiln_worker_inside_slurm", with(kSlurm, with(kTorchrun, {{"KILN_LAUNCHED_BY_KILN", "1"}})),
         dist("kiln", 5, 1, 8, 4, 1, "host0", 29500, "run42")));
  add(err("kiln_marker_without_rank_fails_instead_of_relaunching", {{"KILN_LAUNCHED_BY_KILN", "1"}},
          {"launcher environment (kiln): RANK is not set", "KILN_LAUNCHED_BY_KILN"}));
  add(err("kiln_worker_bad_rank", with(kTorchrun, {{"KILN_LAUNCHED_BY_KILN", "1"}, {"RANK", "9"}}),
          {"launcher environment (kiln): RANK=9 must be less than WORLD_SIZE=8"}));

  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    add(err(std::string("torchrun_missing_") + name, without(kTorchrun, {name}),
            {std::string("launcher environment (torchrun): ") + name + " is not set; " + kTorchrunHint}));
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"})
    add(err(std::string("torchrun_not_integer_") + name, with(kTorchrun, {{name, "two"}}),
            {std::string("launcher environment (torchrun): ") + name + "='two' is not an integer"}));
  const std::vector<std::pair<std::string, std::string>> bad_integers = {
      {"empty", ""},       {"fraction", "1.5"}, {"leading_space", " 1"}, {"trailing_space", "1 "},
      {"plus_sign", "+1"}, {"hex", "0x10"},     {"trailing_junk", "1abc"}, {"minus_alone", "-"},
  };
  for (const auto& [label, value] : bad_integers)
    add(err("torchrun_rank_" + label, with(kTorchrun, {{"RANK", value}}), {"RANK='" + value + "' is not an integer"}));
  add(err("torchrun_rank_negative", with(kTorchrun, {{"RANK", "-1"}}), {"RANK=-1 is negative"}));
  add(err("torchrun_rank_overflow", with(kTorchrun, {{"RANK", "99999999999999999999"}}),
          {"RANK='99999999999999999999' is too large"}));
  add(err("torchrun_value_with_newline_is_escaped", with(kTorchrun, {{"RANK", "1\n2"}}), {"RANK='1\\n2' is not an integer"}));
  add(err("torchrun_value_with_quote_is_escaped", with(kTorchrun, {{"WORLD_SIZE", "8'"}}), {"WORLD_SIZE='8\\'' is not"}));

  add(err("torchrun_rank_equals_world_size", with(kTorchrun, {{"RANK", "8"}}),
          {"launcher environment (torchrun): RANK=8 must be less than WORLD_SIZE=8"}));
  add(err("torchrun_world_size_zero", with(kTorchrun, {{"WORLD_SIZE", "0"}}), {"WORLD_SIZE=0 must be at least 1"}));
  add(err("torchrun_local_rank_equals_local_world_size", with(kTorchrun, {{"LOCAL_RANK", "4"}}),
          {"LOCAL_RANK=4 must be less than LOCAL_WORLD_SIZE=4"}));
  add(err("torchrun_local_rank_without_local_world_size", without(with(kTorchrun, {{"LOCAL_RANK", "8"}}), {"LOCAL_WORLD_SIZE"}),
          {"LOCAL_RANK=8 must be less than LOCAL_WORLD_SIZE (unset, so WORLD_SIZE=8)"}));
  add(err("torchrun_local_world_size_zero", with(kTorchrun, {{"LOCAL_WORLD_SIZE", "0"}}),
          {"LOCAL_WORLD_SIZE=0 must be at least 1"}));
  add(err("torchrun_local_world_size_exceeds_world_size", with(kTorchrun, {{"LOCAL_WORLD_SIZE", "16"}}),
          {"LOCAL_WORLD_SIZE=16 must not exceed WORLD_SIZE=8"}));
  add(err("torchrun_group_rank_mismatch", with(kTorchrun, {{"GROUP_RANK", "0"}}),
          {"GROUP_RANK=0 does not match RANK=5 / LOCAL_WORLD_SIZE=4 = node 1"}));
  add(err("torchrun_group_rank_without_local_world_size", without(kTorchrun, {"LOCAL_WORLD_SIZE"}),
          {"GROUP_RANK=1", "LOCAL_WORLD_SIZE is not set", "set LOCAL_WORLD_SIZE"}));
  for (const char* port : {"0", "65536", "70000"})
    add(err(std::string("torchrun_port_out_of_range_") + port, with(kTorchrun, {{"MASTER_PORT", port}}),
            {std::string("MASTER_PORT=") + port + " is not a TCP port", "between 1 and 65535"}));
  add(err("torchrun_master_port_negative", with(kTorchrun, {{"MASTER_PORT", "-29500"}}), {"MASTER_PORT=-29500 is negative"}));
  add(err("torchrun_master_addr_empty", with(kTorchrun, {{"MASTER_ADDR", ""}}), {"MASTER_ADDR is set but empty"}));
  add(err("torchrun_master_addr_trailing_space", with(kTorchrun, {{"MASTER_ADDR", "host0 "}}),
          {"MASTER_ADDR='host0 ' contains whitespace"}));

  // ------------------------------------------------------------------- SLURM
  add(ok("slurm_full", kSlurm, kSlurmExpected));
  for (const char* name : {"SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID"})
    add(err(std::string("slurm_missing_") + name, without(kSlurm, {name}),
            {std::string("launcher environment (slurm): ") + name + " is not set; srun sets SLURM_PROCID"}));
  add(err("slurm_missing_SLURM_NODELIST", without(kSlurm, {"SLURM_NODELIST", "SLURM_JOB_NODELIST"}),
          {"launcher environment (slurm): SLURM_NODELIST is not set", "MASTER_ADDR"}));
  add(err("slurm_missing_SLURM_JOB_ID_and_MASTER_PORT", without(kSlurm, {"SLURM_JOB_ID"}),
          {"launcher environment (slurm): neither MASTER_PORT nor SLURM_JOB_ID is set"}));
  add(err("slurm_missing_every_tasks_per_node_source",
          without(kSlurm, {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES"}),
          {"cannot tell how many tasks run on this node", "SLURM_TASKS_PER_NODE", "SLURM_NNODES"}));
  for (const char* name : {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_JOB_ID", "MASTER_PORT"})
    add(err(std::string("slurm_not_integer_") + name, with(kSlurm, {{name, "two"}}),
            {std::string("launcher environment (slurm): ") + name + "='two' is not an integer"}));
  add(err("slurm_not_integer_SLURM_NNODES", without(with(kSlurm, {{"SLURM_NNODES", "two"}}), {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}),
          {"SLURM_NNODES='two' is not an integer"}));
  add(err("slurm_procid_equals_ntasks", with(kSlurm, {{"SLURM_PROCID", "8"}}),
          {"launcher environment (slurm): SLURM_PROCID=8 must be less than SLURM_NTASKS=8"}));
  add(err("slurm_ntasks_zero", with(kSlurm, {{"SLURM_NTASKS", "0"}}), {"SLURM_NTASKS=0 must be at least 1"}));
  add(err("slurm_localid_out_of_range", with(kSlurm, {{"SLURM_LOCALID", "4"}}),
          {"SLURM_LOCALID=4 must be less than the 4 tasks on node 1 (from SLURM_TASKS_PER_NODE='4(x2)')"}));
  add(err("slurm_tasks_per_node_exceeds_ntasks", with(kSlurm, {{"SLURM_TASKS_PER_NODE", "16(x2)"}}),
          {"the 16 tasks on node 1", "must not exceed SLURM_NTASKS=8"}));

  // Port: derived 15000 + SLURM_JOB_ID % 10000 unless MASTER_PORT is set.
  add(ok("slurm_port_small_job_id", with(kSlurm, {{"SLURM_JOB_ID", "7"}}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu03", 15007, "7")));
  add(ok("slurm_port_job_id_multiple_of_10000", with(kSlurm, {{"SLURM_JOB_ID", "20000"}}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu03", 15000, "20000")));
  add(ok("slurm_port_job_id_9999", with(kSlurm, {{"SLURM_JOB_ID", "4109999"}}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu03", 24999, "4109999")));
  add(ok("slurm_master_port_overrides_job_id", with(kSlurm, {{"MASTER_PORT", "12345"}}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu03", 12345, "123456")));
  add(ok("slurm_master_port_without_job_id", without(with(kSlurm, {{"MASTER_PORT", "12345"}}), {"SLURM_JOB_ID"}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu03", 12345, "")));
  add(ok("slurm_master_port_set_job_id_not_numeric", with(kSlurm, {{"MASTER_PORT", "12345"}, {"SLURM_JOB_ID", "x1"}}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu03", 12345, "x1")));
  add(err("slurm_master_port_out_of_range", with(kSlurm, {{"MASTER_PORT", "65536"}}),
          {"launcher environment (slurm): MASTER_PORT=65536 is not a TCP port"}));

  // Address: MASTER_ADDR, else the first host of the step's / job's node list.
  add(ok("slurm_master_addr_overrides_nodelist", with(kSlurm, {{"MASTER_ADDR", "10.0.0.1"}}),
         dist("slurm", 5, 1, 8, 4, 1, "10.0.0.1", 18456, "123456")));
  add(ok("slurm_master_addr_overrides_malformed_nodelist", with(kSlurm, {{"MASTER_ADDR", "ib-host0"}, {"SLURM_NODELIST", "gpu[03"}}),
         dist("slurm", 5, 1, 8, 4, 1, "ib-host0", 18456, "123456")));
  add(err("slurm_master_addr_empty", with(kSlurm, {{"MASTER_ADDR", ""}}),
          {"launcher environment (slurm): MASTER_ADDR is set but empty", "unset it"}));
  add(ok("slurm_job_nodelist_fallback", without(with(kSlurm, {{"SLURM_JOB_NODELIST", "cpu[7-9]"}}), {"SLURM_NODELIST"}),
         dist("slurm", 5, 1, 8, 4, 1, "cpu7", 18456, "123456")));
  add(ok("slurm_step_nodelist_preferred", with(kSlurm, {{"SLURM_STEP_NODELIST", "gpu04"}}),
         dist("slurm", 5, 1, 8, 4, 1, "gpu04", 18456, "123456")));
  add(err("slurm_malformed_nodelist", with(kSlurm, {{"SLURM_NODELIST", "gpu[03-04"}}),
          {"launcher environment (slurm): SLURM_NODELIST='gpu[03-04' has an unbalanced '['"}));
  add(err("slurm_malformed_job_nodelist_names_it", without(with(kSlurm, {{"SLURM_JOB_NODELIST", "gpu]"}}), {"SLURM_NODELIST"}),
          {"SLURM_JOB_NODELIST='gpu]' has an unbalanced ']'"}));
  add(err("slurm_empty_nodelist", with(kSlurm, {{"SLURM_NODELIST", ""}}), {"SLURM_NODELIST is set but empty"}));

  // Tasks on this node.
  const Env uneven = without(with(kSlurm, {{"SLURM_NTASKS", "11"}, {"SLURM_NNODES", "3"}, {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                                           {"SLURM_NODELIST", "n[1-3]"}}),
                             {"SLURM_NTASKS_PER_NODE"});
  add(ok("slurm_tasks_per_node_uneven_first_node", with(uneven, {{"SLURM_PROCID", "1"}, {"SLURM_NODEID", "0"}}),
         dist("slurm", 1, 1, 11, 4, 0, "n1", 18456, "123456")));
  add(ok("slurm_tasks_per_node_uneven_second_node", with(uneven, {{"SLURM_PROCID", "5"}, {"SLURM_NODEID", "1"}}),
         dist("slurm", 5, 1, 11, 4, 1, "n1", 18456, "123456")));
  add(ok("slurm_tasks_per_node_uneven_last_node", with(uneven, {{"SLURM_PROCID", "9"}, {"SLURM_NODEID", "2"}}),
         dist("slurm", 9, 1, 11, 3, 2, "n1", 18456, "123456")));
  add(err("slurm_tasks_per_node_uneven_local_id_too_big", with(uneven, {{"SLURM_PROCID", "10"}, {"SLURM_NODEID", "2"}, {"SLURM_LOCALID", "3"}}),
          {"SLURM_LOCALID=3 must be less than the 3 tasks on node 2 (from SLURM_TASKS_PER_NODE='4(x2),3')"}));
  add(ok("slurm_tasks_per_node_plain_list", with(uneven, {{"SLURM_TASKS_PER_NODE", "4,4,3"}, {"SLURM_NODEID", "2"}, {"SLURM_PROCID", "9"}}),
         dist("slurm", 9, 1, 11, 3, 2, "n1", 18456, "123456")));
  add(err("slurm_tasks_per_node_too_few_nodes", with(kSlurm, {{"SLURM_TASKS_PER_NODE", "4"}}),
          {"SLURM_TASKS_PER_NODE='4' describes 1 node(s) but SLURM_NODEID=1"}));
  add(ok("slurm_step_tasks_per_node_preferred",
         with(kSlurm, {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "3"}}),
         dist("slurm", 3, 1, 4, 2, 1, "gpu03", 18456, "123456")));
  // sbatch --ntasks-per-node=4 --ntasks=4 on 4 nodes: the request says 4, the
  // layout Slurm made says 1 per node; the layout wins.
  add(ok("slurm_tasks_per_node_beats_requested_ntasks_per_node",
         with(kSlurm, {{"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "4"}, {"SLURM_TASKS_PER_NODE", "1(x4)"}, {"SLURM_PROCID", "2"},
                       {"SLURM_NODEID", "2"}, {"SLURM_LOCALID", "0"}}),
         dist("slurm", 2, 0, 4, 1, 2, "gpu03", 18456, "123456")));
  add(ok("slurm_ntasks_per_node_when_no_list", without(with(kSlurm, {{"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_NNODES", "5"}}), {"SLURM_TASKS_PER_NODE"}),
         kSlurmExpected));
  add(ok("slurm_ntasks_per_node_not_plain_falls_back_to_nnodes",
         without(with(kSlurm, {{"SLURM_NTASKS_PER_NODE", "4(x2)"}}), {"SLURM_TASKS_PER_NODE"}), kSlurmExpected));
  add(ok("slurm_ntasks_divided_by_nnodes", without(kSlurm, {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}), kSlurmExpected));
  add(err("slurm_ntasks_not_divisible_by_nnodes",
          without(with(kSlurm, {{"SLURM_NNODES", "3"}}), {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}),
          {"SLURM_NTASKS=8 is not divisible by SLURM_NNODES=3"}));
  add(err("slurm_nnodes_zero", without(with(kSlurm, {{"SLURM_NNODES", "0"}}), {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}),
          {"SLURM_NNODES=0 must be at least 1"}));
  for (const char* bad : {"4(x2", "4(2)", "4(x)", "(x2)", "4,,3", "a", "4(x2)3", "4,"})
    add(err(std::string("slurm_tasks_per_node_malformed_") + bad, with(kSlurm, {{"SLURM_TASKS_PER_NODE", bad}}),
            {std::string("SLURM_TASKS_PER_NODE='") + bad + "' has a malformed group"}));
  add(err("slurm_tasks_per_node_empty", with(kSlurm, {{"SLURM_TASKS_PER_NODE", ""}}), {"SLURM_TASKS_PER_NODE is set but empty"}));
  add(err("slurm_tasks_per_node_zero", with(kSlurm, {{"SLURM_TASKS_PER_NODE", "0(x2)"}}),
          {"the 0 tasks on node 1 (from SLURM_TASKS_PER_NODE='0(x2)') must be at least 1"}));

  // ---------------------------------------------------------------- Open MPI
  add(ok("openmpi_full", kOmpi, kOmpiExpected));
  // OMPI_COMM_WORLD_NODE_RANK is a per-node process index, not the node.
  add(ok("openmpi_node_rank_ignores_OMPI_COMM_WORLD_NODE_RANK", with(kOmpi, {{"OMPI_COMM_WORLD_NODE_RANK", "0"}}), kOmpiExpected));
  add(ok("openmpi_without_node_rank_variable", without(kOmpi, {"OMPI_COMM_WORLD_NODE_RANK"}), kOmpiExpected));
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    add(err(std::string("openmpi_missing_") + name, without(kOmpi, {name}),
            {std::string("launcher environment (openmpi): ") + name + " is not set; mpirun sets"}));
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT"})
    add(err(std::string("openmpi_missing_") + name, without(kOmpi, {name}),
            {std::string("launcher environment (openmpi): ") + name + " is not set",
             "Open MPI has no rendezvous address of its own", "mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500"}));
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE", "MASTER_PORT"})
    add(err(std::string("openmpi_not_integer_") + name, with(kOmpi, {{name, "two"}}),
            {std::string("launcher environment (openmpi): ") + name + "='two' is not an integer"}));
  add(err("openmpi_rank_equals_size", with(kOmpi, {{"OMPI_COMM_WORLD_RANK", "8"}}),
          {"OMPI_COMM_WORLD_RANK=8 must be less than OMPI_COMM_WORLD_SIZE=8"}));
  add(err("openmpi_local_rank_equals_local_size", with(kOmpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "4"}}),
          {"OMPI_COMM_WORLD_LOCAL_RANK=4 must be less than OMPI_COMM_WORLD_LOCAL_SIZE=4"}));
  add(err("openmpi_local_size_exceeds_size", with(kOmpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "9"}}),
          {"OMPI_COMM_WORLD_LOCAL_SIZE=9 must not exceed OMPI_COMM_WORLD_SIZE=8"}));
  add(err("openmpi_port_out_of_range", with(kOmpi, {{"MASTER_PORT", "0"}}), {"MASTER_PORT=0 is not a TCP port"}));
  add(err("openmpi_master_addr_empty", with(kOmpi, {{"MASTER_ADDR", ""}}), {"MASTER_ADDR is set but empty"}));
  return cases;
}

std::string test_name(const std::string& name) {
  std::string out;
  for (const char ch : name) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

void expect_one_line_input_error(const std::string& message, const std::vector<std::string>& fragments) {
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.find('\r'), std::string::npos) << message;
  EXPECT_EQ(message.rfind("launcher environment (", 0), 0u) << message;
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << "missing: " << fragment << "\nin: " << message;
}

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

class DetectLauncher : public testing::TestWithParam<Case> {};

TEST_P(DetectLauncher, Row) {
  const Case& c = GetParam();
  switch (c.kind) {
    case Case::kNone:
      EXPECT_FALSE(detect_launcher(lookup(c.env)).has_value());
      break;
    case Case::kOk: {
      const std::optional<DistEnv> got = detect_launcher(lookup(c.env));
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(got->launcher, c.expected.launcher);
      EXPECT_EQ(got->rank, c.expected.rank);
      EXPECT_EQ(got->local_rank, c.expected.local_rank);
      EXPECT_EQ(got->world_size, c.expected.world_size);
      EXPECT_EQ(got->local_world_size, c.expected.local_world_size);
      EXPECT_EQ(got->node_rank, c.expected.node_rank);
      EXPECT_EQ(got->master_addr, c.expected.master_addr);
      EXPECT_EQ(got->master_port, c.expected.master_port);
      EXPECT_EQ(got->run_id, c.expected.run_id);
      break;
    }
    case Case::kError:
      try {
        detect_launcher(lookup(c.env));
        ADD_FAILURE() << "expected an InputError containing: " << c.fragments.front();
      } catch (const InputError& e) {
        expect_one_line_input_error(e.what(), c.fragments);
      }
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, DetectLauncher, testing::ValuesIn(launcher_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return test_name(info.param.name); });

// ---------------------------------------------------------- node lists --

struct HostCase {
  std::string nodelist;
  std::string host;   // expected first host; empty: an error
  std::string error;  // fragment of the error
};

std::ostream& operator<<(std::ostream& os, const HostCase& c) { return os << "'" << c.nodelist << "'"; }

const std::vector<HostCase> kHostCases = {
    {"node01", "node01", ""},
    {"node[01-04]", "node01", ""},
    {"node[03-05,07],gpu1", "node03", ""},
    {"a-b-c[1,2]", "a-b-c1", ""},
    {"host1,host2", "host1", ""},
    {"n[007-010]", "n007", ""},
    {"n[5]", "n5", ""},
    {"gpu1,node[03-05]", "gpu1", ""},
    {"rack[1-2]-node[01-04]", "rack1-node01", ""},
    {"n[1-2]-ib", "n1-ib", ""},
    {"node.cluster.local", "node.cluster.local", ""},
    {"n[9-10]", "n9", ""},
    {"", "", "SLURM_NODELIST is set but empty"},
    {"node[01-04", "", "SLURM_NODELIST='node[01-04' has an unbalanced '['"},
    {"node01-04]", "", "SLURM_NODELIST='node01-04]' has an unbalanced ']'"},
    {"node[01-04]]", "", "has an unbalanced ']'"},
    {"n[[1]]", "", "has an unbalanced '['"},
    {"n[1,2],m[3", "", "has an unbalanced '['"},
    {"n[]", "", "has a malformed range ''"},
    {"n[a-b]", "", "has a malformed range 'a-b'"},
    {"n[4-2]", "", "has a malformed range '4-2'"},
    {"n[1-]", "", "has a malformed range '1-'"},
    {"n[1,]", "", "has a malformed range ''"},
    {"n[1-2-3]", "", "has a malformed range '1-2-3'"},
    {"host1,,host2", "", "has an empty host name"},
    {",host1", "", "has an empty host name"},
    {"host1,", "", "has an empty host name"},
    {"node 01", "", "contains whitespace"},
    {"node01\n", "", "SLURM_NODELIST='node01\\n' contains whitespace"},
    {"n[1\n]", "", "SLURM_NODELIST='n[1\\n]' has a malformed range '1\\n' in '[1\\n]'"},
};

void PrintTo(const HostCase& c, std::ostream* out) { *out << c.nodelist; }

class FirstSlurmHost : public testing::TestWithParam<HostCase> {};

TEST_P(FirstSlurmHost, Row) {
  const HostCase& c = GetParam();
  if (!c.host.empty()) {
    EXPECT_EQ(first_slurm_host(c.nodelist), c.host);
    return;
  }
  try {
    const std::string host = first_slurm_host(c.nodelist);
    ADD_FAILURE() << "expected an InputError, got '" << host << "'";
  } catch (const InputError& e) {
    expect_one_line_input_error(e.what(), {"launcher environment (slurm): ", "SLURM_NODELIST", c.error});
  }
}

INSTANTIATE_TEST_SUITE_P(Table, FirstSlurmHost, testing::ValuesIn(kHostCases));

// ------------------------------------------------------ the real thing --

TEST(ProcessEnvironment, WrapsGetenv) {
  const std::string name = "KILN_LAUNCH_ENV_TEST_VARIABLE";
  const EnvLookup env = process_environment();
  ::unsetenv(name.c_str());
  EXPECT_FALSE(env(name).has_value());
  ::setenv(name.c_str(), "", 1);
  EXPECT_EQ(env(name), std::optional<std::string>(""));
  ::setenv(name.c_str(), "value 1", 1);
  EXPECT_EQ(env(name), std::optional<std::string>("value 1"));
  ::unsetenv(name.c_str());
  EXPECT_FALSE(env(name).has_value());
}

}  // namespace
}  // namespace kiln
