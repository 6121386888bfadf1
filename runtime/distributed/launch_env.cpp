// Reads where this process sits in a distributed run from the environment of
// an external launcher. See launch_env.hpp for the contract.
//
// Detection order (the first launcher whose marker is present wins; the others
// are then not looked at, not even cross-checked):
//   1. torchrun / TorchElastic: RANK, WORLD_SIZE, LOCAL_RANK or
//      TORCHELASTIC_RUN_ID is set (or KILN_LAUNCHED_BY_KILN=1, see below).
//      torchrun wins over SLURM and Open MPI because running torchrun inside an
//      salloc/sbatch allocation (or under mpirun, one agent per node) is common:
//      the SLURM_* / OMPI_* variables then describe the agent, not the worker.
//   2. SLURM (srun): SLURM_PROCID is set.
//   3. Open MPI (mpirun): OMPI_COMM_WORLD_RANK is set.
// Nothing set -> nullopt, and kiln starts its own workers.
//
// Every error is an InputError with one line: "launcher environment
// (<launcher>): <VARIABLE and what is wrong>; <what to do>". Values are quoted
// with control characters escaped, so a value can never break the line.
#include "distributed/launch_env.hpp"

#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "util/errors.hpp"

namespace kiln {
namespace {

constexpr const char* kTorchrunHint =
    "torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; if you set them by "
    "hand, set all five, or unset RANK, LOCAL_RANK, WORLD_SIZE and TORCHELASTIC_RUN_ID to let "
    "kiln start its own workers";
constexpr const char* kKilnHint =
    "kiln's supervisor sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every "
    "worker it starts; unset KILN_LAUNCHED_BY_KILN unless kiln started this process";
constexpr const char* kSlurmHint =
    "srun sets SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID and SLURM_NODELIST for "
    "every task; start kiln with srun inside the allocation";
constexpr const char* kOmpiHint =
    "mpirun sets OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK and "
    "OMPI_COMM_WORLD_LOCAL_SIZE; start kiln with mpirun";
constexpr const char* kOmpiRendezvousHint =
    "Open MPI has no rendezvous address of its own, so export MASTER_ADDR and MASTER_PORT to "
    "every rank, e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...";

// 'value' in single quotes, with control characters and quotes escaped so
// the message stays on one line whatever the environment holds.
std::string quoted(const std::string& value) {
  static const char* const kHex = "0123456789abcdef";
  std::string out = "'";
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += ch;
    }
  }
  out += "'";
  return out;
}

[[noreturn]] void fail(const std::string& launcher, const std::string& what) {
  throw InputError("launcher environment (" + launcher + "): " + what);
}

// A whole-string, non-negative decimal integer: no sign, no spaces, no
// trailing junk, no overflow.
int64_t parse_count(const std::string& launcher, const std::string& name, const std::string& value) {
  if (value.size() > 1 && value[0] == '-') {
    bool digits = true;
    for (size_t i = 1; i < value.size(); ++i) digits = digits && value[i] >= '0' && value[i] <= '9';
    if (digits) fail(launcher, name + "=" + value + " is negative; it must be a non-negative integer");
  }
  if (value.empty()) fail(launcher, name + "='' is not an integer (it is set but empty)");
  int64_t result = 0;
  for (const char ch : value) {
    if (ch < '0' || ch > '9') fail(launcher, name + "=" + quoted(value) + " is not an integer");
    const int64_t digit = ch - '0';
    if (result > (std::numeric_limits<int64_t>::max() - digit) / 10)
      fail(launcher, name + "=" + quoted(value) + " is too large");
    result = result * 10 + digit;
  }
  return result;
}

// Lookups and "not set" errors for one launcher.
struct Reader {
  const EnvLookup& env;
  std::string launcher;
  std::string hint;  // appended to "X is not set"

  std::optional<std::string> get(const std::string& name) const { return env(name); }

  std::string require(const std::string& name) const {
    std::optional<std::string> value = env(name);
    if (!value) fail(launcher, name + " is not set; " + hint);
    return *value;
  }
  int64_t require_count(const std::string& name) const { return parse_count(launcher, name, require(name)); }
  std::optional<int64_t> optional_count(const std::string& name) const {
    std::optional<std::string> value = env(name);
    if (!value) return std::nullopt;
    return parse_count(launcher, name, *value);
  }
};

std::string master_addr_checked(const std::string& launcher, const std::string& value) {
  if (value.empty())
    fail(launcher, "MASTER_ADDR is set but empty; set it to the host name or address of rank 0");
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7f)
      fail(launcher, "MASTER_ADDR=" + quoted(value) +
                         " contains whitespace or control characters; set it to the host name or "
                         "address of rank 0");
  }
  return value;
}

int64_t master_port_checked(const std::string& launcher, const std::string& value) {
  const int64_t port = parse_count(launcher, "MASTER_PORT", value);
  if (port < 1 || port > 65535)
    fail(launcher, "MASTER_PORT=" + std::to_string(port) +
                       " is not a TCP port; use a free port between 1 and 65535 (e.g. 29500)");
  return port;
}

// Names used in the range checks, so each message names the launcher's own
// variables. local_world_size is a noun phrase ("LOCAL_WORLD_SIZE=4", or where
// the count was derived from).
struct Names {
  std::string rank, local_rank, world_size, local_world_size;
};

void check_ranges(const std::string& launcher, const DistEnv& d, const Names& n) {
  if (d.world_size < 1)
    fail(launcher, n.world_size + "=" + std::to_string(d.world_size) + " must be at least 1");
  if (d.rank >= d.world_size)
    fail(launcher, n.rank + "=" + std::to_string(d.rank) + " must be less than " + n.world_size + "=" +
                       std::to_string(d.world_size));
  if (d.local_world_size < 1) fail(launcher, n.local_world_size + " must be at least 1");
  if (d.local_world_size > d.world_size)
    fail(launcher, n.local_world_size + " must not exceed " + n.world_size + "=" +
                       std::to_string(d.world_size));
  if (d.local_rank >= d.local_world_size)
    fail(launcher, n.local_rank + "=" + std::to_string(d.local_rank) + " must be less than " +
                       n.local_world_size);
}

// ---------------------------------------------------------------- torchrun --

std::optional<DistEnv> from_torchrun(const EnvLookup& env, bool launched_by_kiln) {
  const std::string launcher = launched_by_kiln ? "kiln" : "torchrun";
  const Reader r{env, launcher, launched_by_kiln ? kKilnHint : kTorchrunHint};
  DistEnv d;
  d.launcher = launcher;
  d.rank = r.require_count("RANK");
  d.local_rank = r.require_count("LOCAL_RANK");
  d.world_size = r.require_count("WORLD_SIZE");
  d.master_addr = master_addr_checked(launcher, r.require("MASTER_ADDR"));
  d.master_port = master_port_checked(launcher, r.require("MASTER_PORT"));
  d.run_id = r.get("TORCHELASTIC_RUN_ID").value_or("");
  if (!launched_by_kiln) {
    // As torch.distributed.rendezvous reads them: the agent's store is used
    // when the variable is the text "True".
    d.agent_store = r.get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    d.restart_count = r.optional_count("TORCHELASTIC_RESTART_COUNT").value_or(0);
    d.error_file = r.get("TORCHELASTIC_ERROR_FILE").value_or("");
  }

  Names names{"RANK", "LOCAL_RANK", "WORLD_SIZE", ""};
  const std::optional<int64_t> lws = r.optional_count("LOCAL_WORLD_SIZE");
  if (lws) {
    d.local_world_size = *lws;
    names.local_world_size = "LOCAL_WORLD_SIZE=" + std::to_string(*lws);
  } else {
    // Hand-set single-node runs often omit it (torchrun itself always sets
    // it): every rank is then taken to be on this one node.
    d.local_world_size = d.world_size;
    names.local_world_size = "LOCAL_WORLD_SIZE (unset, so WORLD_SIZE=" + std::to_string(d.world_size) + ")";
  }
  check_ranges(launcher, d, names);
  // torchrun numbers ranks node by node; kiln assumes every node runs
  // LOCAL_WORLD_SIZE workers, so the node is rank / LOCAL_WORLD_SIZE.
  d.node_rank = d.rank / d.local_world_size;
  if (const std::optional<int64_t> group_rank = r.optional_count("GROUP_RANK")) {
    if (*group_rank != d.node_rank) {
      if (!lws)
        fail(launcher, "GROUP_RANK=" + std::to_string(*group_rank) +
                           " says this is not node 0, but LOCAL_WORLD_SIZE is not set, so all " +
                           std::to_string(d.world_size) +
                           " ranks are taken to be on one node; set LOCAL_WORLD_SIZE to the "
                           "number of workers per node");
      fail(launcher, "GROUP_RANK=" + std::to_string(*group_rank) + " does not match RANK=" +
                         std::to_string(d.rank) + " / LOCAL_WORLD_SIZE=" +
                         std::to_string(d.local_world_size) + " = node " + std::to_string(d.node_rank) +
                         "; kiln needs the same number of workers (LOCAL_WORLD_SIZE) on every node, "
                         "numbered node by node");
    }
  }
  return d;
}

// ------------------------------------------------------------------- SLURM --

// Per-node task counts "4(x2),3" -> {4, 4, 3}, expanded lazily: returns the
// count for node 'node', or fails naming 'name'.
int64_t tasks_on_node(const std::string& name, const std::string& value, int64_t node) {
  const std::string what = name + "=" + quoted(value);
  const std::string expect = "; expected counts such as '4(x2),3'";
  if (value.empty()) fail("slurm", name + " is set but empty" + expect);
  int64_t seen = 0;
  size_t pos = 0;
  while (true) {
    size_t end = value.find(',', pos);
    if (end == std::string::npos) end = value.size();
    const std::string group = value.substr(pos, end - pos);
    std::string count = group;
    std::string repeat = "1";
    const size_t paren = group.find('(');
    if (paren != std::string::npos) {
      if (group.size() < paren + 4 || group.compare(paren, 2, "(x") != 0 || group.back() != ')')
        fail("slurm", what + " has a malformed group " + quoted(group) + expect);
      count = group.substr(0, paren);
      repeat = group.substr(paren + 2, group.size() - paren - 3);
    }
    for (const std::string* part : {&count, &repeat}) {
      bool ok = !part->empty() && part->size() <= 9;
      for (const char ch : *part) ok = ok && ch >= '0' && ch <= '9';
      if (!ok) fail("slurm", what + " has a malformed group " + quoted(group) + expect);
    }
    const int64_t n = std::stoll(count), times = std::stoll(repeat);
    if (node < seen + times) return n;
    seen += times;
    if (end == value.size()) break;
    pos = end + 1;
  }
  fail("slurm", what + " describes " + std::to_string(seen) + " node(s) but SLURM_NODEID=" + std::to_string(node) +
                    "; the layout and this task's node disagree, so its task count is unknown");
}

// Where the first host of a SLURM host list failed, naming the variable.
std::string first_host_of(const std::string& name, const std::string& list) {
  const std::string what = name + "=" + quoted(list);
  const std::string expect = "; expected a Slurm host list such as 'node[01-04],gpu1'";
  if (list.empty()) fail("slurm", name + " is set but empty" + expect);

  std::string first;
  size_t item_start = 0;
  bool first_item = true;
  size_t i = 0;
  std::string host;
  while (true) {
    if (i == list.size() || list[i] == ',') {
      if (i == item_start) fail("slurm", what + " has an empty host name" + expect);
      if (first_item) first = host;
      first_item = false;
      host.clear();
      if (i == list.size()) break;
      item_start = ++i;
      continue;
    }
    const char ch = list[i];
    if (ch == ']') fail("slurm", what + " has an unbalanced ']'" + expect);
    if (static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f)
      fail("slurm", what + " contains whitespace or control characters" + expect);
    if (ch != '[') {
      host += ch;
      ++i;
      continue;
    }
    const size_t close = list.find_first_of("[]", i + 1);
    if (close == std::string::npos || list[close] != ']')
      fail("slurm", what + " has an unbalanced '['" + expect);
    // Ranges "01-04,07": check all, keep the first start as written (so zero
    // padding survives: "n[007-010]" -> "n007").
    const std::string inner = list.substr(i + 1, close - i - 1);
    std::string first_in_group;
    size_t pos = 0;
    while (true) {
      size_t end = inner.find(',', pos);
      if (end == std::string::npos) end = inner.size();
      const std::string range = inner.substr(pos, end - pos);
      const size_t dash = range.find('-');
      const std::string lo = range.substr(0, dash);
      const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      bool ok = !lo.empty() && !hi.empty() && lo.size() <= 18 && hi.size() <= 18;
      for (const char c : lo + hi) ok = ok && c >= '0' && c <= '9';
      if (!ok || std::stoll(lo) > std::stoll(hi))
        fail("slurm", what + " has a malformed range " + quoted(range) + " in " + quoted("[" + inner + "]") + expect);
      if (first_in_group.empty()) first_in_group = lo;
      if (end == inner.size()) break;
      pos = end + 1;
    }
    host += first_in_group;
    i = close + 1;
  }
  return first;
}

// How many tasks run on this node, and where that count came from (for the
// range checks' messages).
struct NodeTasks {
  int64_t count;
  std::string described;
};

// The per-node lists describe the layout Slurm actually made (the step's
// first, as srun sets it; then the job's) and are indexed by SLURM_NODEID, so
// uneven layouts such as "4(x2),3" give each node its own count.
std::optional<NodeTasks> slurm_tasks_from_layout(const Reader& r, int64_t node) {
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (const std::optional<std::string> list = r.get(name)) {
      const int64_t count = tasks_on_node(name, *list, node);
      return NodeTasks{count, "the " + std::to_string(count) + " tasks on node " + std::to_string(node) +
                                  " (from " + name + "=" + quoted(*list) + ")"};
    }
  }
  return std::nullopt;
}

// SLURM_NTASKS_PER_NODE is only the requested --ntasks-per-node, which Slurm
// treats as a maximum when --ntasks is also given, so it comes after the
// layout; a value that is not a plain integer is passed over, not refused.
std::optional<NodeTasks> slurm_tasks_requested(const Reader& r) {
  const std::optional<std::string> per_node = r.get("SLURM_NTASKS_PER_NODE");
  if (!per_node) return std::nullopt;
  bool plain = !per_node->empty() && per_node->size() <= 9;
  for (const char ch : *per_node) plain = plain && ch >= '0' && ch <= '9';
  if (!plain) return std::nullopt;
  return NodeTasks{std::stoll(*per_node), "SLURM_NTASKS_PER_NODE=" + *per_node};
}

NodeTasks slurm_tasks_by_division(const Reader& r, int64_t world_size) {
  const std::optional<std::string> nnodes_text = r.get("SLURM_NNODES");
  if (!nnodes_text)
    fail("slurm",
         "cannot tell how many tasks run on this node: none of SLURM_STEP_TASKS_PER_NODE, "
         "SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE (as an integer) or SLURM_NNODES is set; " +
             std::string(kSlurmHint));
  const int64_t nnodes = parse_count("slurm", "SLURM_NNODES", *nnodes_text);
  if (nnodes < 1) fail("slurm", "SLURM_NNODES=" + std::to_string(nnodes) + " must be at least 1");
  if (world_size % nnodes != 0)
    fail("slurm", "SLURM_NTASKS=" + std::to_string(world_size) + " is not divisible by SLURM_NNODES=" +
                      std::to_string(nnodes) +
                      " and SLURM_TASKS_PER_NODE is not set, so the tasks on this node are unknown; "
                      "run srun with --ntasks-per-node");
  const int64_t count = world_size / nnodes;
  return NodeTasks{count, "SLURM_NTASKS=" + std::to_string(world_size) + " / SLURM_NNODES=" +
                              std::to_string(nnodes) + " = " + std::to_string(count) + " tasks per node"};
}

NodeTasks slurm_tasks_on_node(const Reader& r, const DistEnv& d) {
  if (std::optional<NodeTasks> tasks = slurm_tasks_from_layout(r, d.node_rank)) return *tasks;
  if (std::optional<NodeTasks> tasks = slurm_tasks_requested(r)) return *tasks;
  return slurm_tasks_by_division(r, d.world_size);
}

// Rank 0's host: MASTER_ADDR if the user set it (e.g. an arbitrary task
// distribution, or a dedicated interface name), else the first node of the
// step's node list, where srun places task 0 under block and cyclic
// distributions. The step's list comes first because a step may run on a
// subset of the job's nodes.
std::string slurm_master_addr(const Reader& r) {
  if (const std::optional<std::string> addr = r.get("MASTER_ADDR")) {
    if (addr->empty())
      fail("slurm",
           "MASTER_ADDR is set but empty; unset it to use the first host of SLURM_NODELIST, or set "
           "it to the host of task 0");
    return master_addr_checked("slurm", *addr);
  }
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"})
    if (const std::optional<std::string> list = r.get(name)) return first_host_of(name, *list);
  fail("slurm",
       "SLURM_NODELIST is not set (nor SLURM_JOB_NODELIST), so the host of task 0 is unknown; "
       "start kiln with srun, which sets it, or set MASTER_ADDR to the host of task 0");
}

// Port: MASTER_PORT if set, else derived from the job id so that every task
// of a job agrees without talking: 15000 + SLURM_JOB_ID % 10000, i.e.
// 15000..24999. This is the formula PyTorch Lightning has used for years
// (15000 + the last four digits of the job id), so a job moved from
// Lightning keeps its port, and the range stays below Linux's ephemeral
// range (32768..60999), where an outgoing connection could already hold the
// port. Jobs whose ids differ by a multiple of 10000 and share rank 0's node
// collide; MASTER_PORT is the way out.
int64_t slurm_master_port(const Reader& r, const std::optional<std::string>& job_id) {
  if (const std::optional<std::string> port = r.get("MASTER_PORT")) return master_port_checked("slurm", *port);
  if (job_id) return 15000 + parse_count("slurm", "SLURM_JOB_ID", *job_id) % 10000;
  fail("slurm",
       "neither MASTER_PORT nor SLURM_JOB_ID is set, so there is no port for task 0's store; set "
       "MASTER_PORT to the same free port for every task");
}

std::optional<DistEnv> from_slurm(const EnvLookup& env) {
  const Reader r{env, "slurm", kSlurmHint};
  DistEnv d;
  d.launcher = "slurm";
  d.rank = r.require_count("SLURM_PROCID");
  d.local_rank = r.require_count("SLURM_LOCALID");
  d.world_size = r.require_count("SLURM_NTASKS");
  d.node_rank = r.require_count("SLURM_NODEID");
  const NodeTasks tasks = slurm_tasks_on_node(r, d);
  d.local_world_size = tasks.count;
  check_ranges("slurm", d, {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", tasks.described});
  d.master_addr = slurm_master_addr(r);
  const std::optional<std::string> job_id = r.get("SLURM_JOB_ID");
  d.master_port = slurm_master_port(r, job_id);
  d.run_id = job_id.value_or("");
  return d;
}

// ----------------------------------------------------------------- Open MPI --

std::optional<DistEnv> from_openmpi(const EnvLookup& env) {
  const Reader r{env, "openmpi", kOmpiHint};
  DistEnv d;
  d.launcher = "openmpi";
  d.rank = r.require_count("OMPI_COMM_WORLD_RANK");
  d.world_size = r.require_count("OMPI_COMM_WORLD_SIZE");
  d.local_rank = r.require_count("OMPI_COMM_WORLD_LOCAL_RANK");
  d.local_world_size = r.require_count("OMPI_COMM_WORLD_LOCAL_SIZE");
  check_ranges("openmpi", d,
               {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_SIZE=" + std::to_string(d.local_world_size)});
  // Not OMPI_COMM_WORLD_NODE_RANK: despite its name, Open MPI documents it as
  // "the relative rank of this process on this node looking across all jobs",
  // a per-node process index, not the index of the node. Open MPI exports no
  // node index; under the default by-slot/by-core mapping ranks fill nodes in
  // order, so the node is rank / local size.
  d.node_rank = d.rank / d.local_world_size;
  const Reader rendezvous{env, "openmpi", kOmpiRendezvousHint};
  d.master_addr = master_addr_checked("openmpi", rendezvous.require("MASTER_ADDR"));
  d.master_port = master_port_checked("openmpi", rendezvous.require("MASTER_PORT"));
  d.run_id = "";
  return d;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::optional<DistEnv> detect_launcher(const EnvLookup& env) {
  // kiln's own workers carry KILN_LAUNCHED_BY_KILN=1 next to the torchrun
  // variables. It alone also counts as "launched": a worker that lost its RANK
  // must fail, not start a supervisor of its own and fork workers again.
  const bool launched_by_kiln = env("KILN_LAUNCHED_BY_KILN") == std::optional<std::string>("1");
  if (launched_by_kiln || env("RANK") || env("WORLD_SIZE") || env("LOCAL_RANK") || env("TORCHELASTIC_RUN_ID"))
    return from_torchrun(env, launched_by_kiln);
  if (env("SLURM_PROCID")) return from_slurm(env);
  if (env("OMPI_COMM_WORLD_RANK")) return from_openmpi(env);
  return std::nullopt;
}

std::string first_slurm_host(const std::string& nodelist) { return first_host_of("SLURM_NODELIST", nodelist); }

}  // namespace kiln
