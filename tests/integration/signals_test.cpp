// Signals told right (issue 18): Ctrl-C (SIGINT, to the process group or to
// the supervisor) always interrupts — exit 130, INTERRUPTED in on_exception —
// whatever the [checkpoint] table says; only the configured preemption
// signal preempts — exit 75, PREEMPTED, and the final line names the
// checkpoint rank 0 committed. 1 and 2 processes, with and without
// [checkpoint], at start-up, mid-epoch and during a (slow) commit. Each
// signal is sent when a condition is seen (a log line), never after a fixed
// sleep; every wait is a bound against hangs on a loaded machine.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>

#include "ckpt/checkpoint_file.hpp"
#include "common.hpp"
#include "launched.hpp"

namespace kiln::test {
namespace {

enum class Moment { startup, mid_epoch, commit };

struct SignalCase {
  const char* name;
  int processes;
  bool checkpoint;
  const char* preempt_signal;  // the manifest's, when not the default (SIGTERM)
  Moment moment;
  int signal;
  // To kiln's pid, to its process group (a terminal's Ctrl-C), or past kiln
  // to the ranks' own process groups (`kill` on them; a terminal of their
  // own): both ranks, or rank 1 alone.
  // `everyone`: kiln and the ranks at once, as `pkill kiln` or SLURM
  // signalling every process of a job step does.
  enum Target { kiln, kiln_group, ranks, rank_1, everyone } target;
  int exit_code;  // 130: interrupted; 75: preempted
};

class Signals : public testing::TestWithParam<SignalCase> {};

// `pid`'s child processes, oldest first (the lowest pid: pids do not wrap
// within a test).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::istringstream in(read_file(task.path() / "children"));
    for (pid_t child; in >> child;) out.push_back(child);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_P(Signals, AreToldApart) {
  const SignalCase c = GetParam();
  TempDir dir;
  std::string extra = "max_epochs = 100000\nbatch_size = 4\n";
  std::string callback;
  if (c.checkpoint) {
    extra += "[checkpoint]\nevery_n_epochs = 1\n";
    if (c.moment == Moment::commit) {
      extra += "every_n_steps = 20\n";
      callback = "save_ms = 2500";  // the commit is under way for 2.5 s
    }
    if (c.preempt_signal) extra += std::string("preempt_signal = \"") + c.preempt_signal + "\"\n";
  }
  const auto manifest = recorder_manifest(dir, "", "size = 64", callback, extra);
  const auto log = dir / "calls.log";
  Launched run(dir, {"fit", manifest.string(), "-n", std::to_string(c.processes)}, dir / "out.txt");
  const std::string at0 = c.processes > 1 ? "@0" : "";
  switch (c.moment) {
    case Moment::startup:
      // Two processes: the workers are being launched (still loading
      // LibTorch, or joining); one: its plugins are being created.
      ASSERT_TRUE(wait_until([&] {
        return c.processes > 1 ? run.output().find("starting 2 worker processes") != std::string::npos
                               : read_file(log).find("model:create") != std::string::npos;
      })) << run.output();
      break;
    case Moment::mid_epoch:
      ASSERT_TRUE(wait_until([&] { return count_lines(read_file(log), "model" + at0 + ":training_step") >= 5; }))
          << run.output();
      break;
    case Moment::commit:
      ASSERT_TRUE(wait_until([&] { return read_file(log).find("callback" + at0 + ":state_save starts") != std::string::npos; }))
          << run.output();
      break;
  }
  const bool in_commit = c.moment == Moment::commit;
  if (c.target == SignalCase::ranks || c.target == SignalCase::rank_1 || c.target == SignalCase::everyone) {
    const std::vector<pid_t> workers = children_of(run.pid());
    ASSERT_EQ(workers.size(), 2u) << run.output();
    if (c.target == SignalCase::everyone) ASSERT_EQ(::kill(run.pid(), c.signal), 0);
    // kiln starts rank 0 first: the lower pid (pids do not wrap in a test's time).
    for (size_t i = c.target == SignalCase::rank_1 ? 1 : 0; i < workers.size(); ++i)
      ASSERT_EQ(::kill(-workers[i], c.signal), 0) << "the rank leads a process group of its own";
  } else {
    ASSERT_EQ(::kill(c.target == SignalCase::kiln_group ? -run.pid() : run.pid(), c.signal), 0);
  }
  const auto status = run.wait();
  ASSERT_TRUE(status.has_value()) << "kiln did not end after the signal\n" << run.output();
  const std::string output = run.output();
  ASSERT_TRUE(WIFEXITED(*status)) << "killed by signal " << WTERMSIG(*status) << "\n" << output;
  EXPECT_EQ(WEXITSTATUS(*status), c.exit_code) << output;
  const std::string calls = read_file(log);
  if (in_commit) {
    EXPECT_NE(calls.find("callback" + at0 + ":state_save ends"), std::string::npos)
        << "the signal arrived while the commit was under way: it ends first\n" << calls;
  }

  const std::string signal_name = std::string("SIG") + sigabbrev_np(c.signal);
  const bool preempted = c.exit_code == 75;
  const std::string kind = preempted ? "PREEMPTED" : "INTERRUPTED";
  EXPECT_EQ(calls.find(preempted ? "failure=INTERRUPTED" : "failure=PREEMPTED"), std::string::npos) << calls;
  for (int r = 0; r < c.processes; ++r) {
    const std::string at = c.processes > 1 ? "@" + std::to_string(r) : "";
    // A rank stopped before it created its plugins has no hook to tell.
    if (calls.find("model" + at + ":create") == std::string::npos) continue;
    // A SIGTERM that interrupts: a rank whose peer acted on it first may see
    // that peer leave before it sees its own signal, and report the peer —
    // it cannot tell the forwarded SIGTERM from the supervisor's own stop of
    // a failed run's survivors. Ctrl-C and preemption are told exactly.
    if (!preempted && (c.signal != SIGINT || c.target == SignalCase::rank_1) && c.processes > 1 &&
        calls.find("model" + at + ":failure=PEER_FAILED") != std::string::npos)
      continue;
    EXPECT_NE(calls.find("model" + at + ":failure=" + kind), std::string::npos) << "rank " << r << "\n" << calls << output;
  }
  // The final line: what happened, and, when preempted, the checkpoint.
  if (!preempted) {
    // A signal to the ranks: the interrupted rank's own line, and that the
    // launcher was not the one signalled; never "exited with code 130".
    EXPECT_EQ(output.find("exited with code 130"), std::string::npos) << output;
    EXPECT_EQ(output.find("second signal"), std::string::npos) << "a rank ended without its cleanup\n" << output;
    if (c.target == SignalCase::ranks || c.target == SignalCase::rank_1) {
      // The last line is the supervisor's: the rank's own report ("...
      // [while waiting in ...] on rank N"), and where the signal went.
      const size_t at = output.rfind("kiln: error: interrupted by " + signal_name);
      ASSERT_NE(at, std::string::npos) << output;
      const std::string last = output.substr(at, output.find('\n', at) - at);
      if (c.target == SignalCase::rank_1) {
        EXPECT_NE(last.find(" on rank 1"), std::string::npos) << output;
        // Rank 0 says it was interrupted only if it was, by the supervisor's
        // forward once rank 1 ended (a second "received" line); stopping with
        // rank 1 at their stop vote, it names rank 1.
        if (output.find("interrupted by " + signal_name + " on rank 0") != std::string::npos) {
          const std::string received = "kiln: " + signal_name + " received;";
          int times = 0;
          for (size_t at = output.find(received); at != std::string::npos; at = output.find(received, at + 1)) ++times;
          EXPECT_GE(times, 2) << output;
        }
      }
      EXPECT_NE(last.find("not to kiln's launcher"), std::string::npos) << output;
      EXPECT_EQ(output.find("second signal"), std::string::npos) << "a rank ended without its cleanup\n" << output;
      return;
    }
    // "... on rank 0" from a single process: it is its own rank 0.
    const std::string line = "kiln: error: interrupted by " + signal_name;
    const size_t at = output.rfind(line);
    ASSERT_NE(at, std::string::npos) << output;
    EXPECT_TRUE(output.compare(at + line.size(), 1, "\n") == 0 || output.compare(at + line.size(), 11, " on rank 0\n") == 0)
        << output;
    EXPECT_EQ(output.find("preempted"), std::string::npos) << output;
    return;
  }
  const std::string head = "kiln: preempted by " + signal_name + "; checkpoint committed: ";
  const size_t at = output.rfind(head);
  ASSERT_NE(at, std::string::npos) << output;
  const std::string rest = output.substr(at + head.size());
  const std::string file = rest.substr(0, rest.find(" (continue with --resume last)"));
  ASSERT_FALSE(file.empty()) << "the report names no checkpoint\n" << output;
  EXPECT_EQ(rest.find(" (continue with --resume last)"), file.size()) << output;
  EXPECT_TRUE(std::filesystem::is_regular_file(file)) << file << "\n" << output;
  EXPECT_FALSE(CheckpointFile::check(file).has_value()) << file;
  EXPECT_EQ(std::filesystem::path(file).parent_path(), dir / "run" / "checkpoints") << output;
}

constexpr SignalCase kCases[] = {
    // Ctrl-C: interrupted, with or without [checkpoint] (whose default preemption signal is SIGTERM).
    {"sigint_at_startup", 1, true, nullptr, Moment::startup, SIGINT, SignalCase::kiln, 130},
    {"sigint_to_group_mid_epoch", 1, true, nullptr, Moment::mid_epoch, SIGINT, SignalCase::kiln_group, 130},
    {"sigint_mid_epoch_without_checkpoint", 1, false, nullptr, Moment::mid_epoch, SIGINT, SignalCase::kiln, 130},
    {"sigint_during_commit", 1, true, nullptr, Moment::commit, SIGINT, SignalCase::kiln, 130},
    {"sigint_at_startup", 2, true, nullptr, Moment::startup, SIGINT, SignalCase::kiln, 130},
    {"sigint_to_group_at_startup", 2, false, nullptr, Moment::startup, SIGINT, SignalCase::kiln_group, 130},
    {"sigint_to_group_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGINT, SignalCase::kiln_group, 130},
    {"sigint_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGINT, SignalCase::kiln, 130},
    {"sigint_mid_epoch_without_checkpoint", 2, false, nullptr, Moment::mid_epoch, SIGINT, SignalCase::kiln, 130},
    {"sigint_during_commit", 2, true, nullptr, Moment::commit, SIGINT, SignalCase::kiln, 130},
    // The preemption signal: a checkpoint, exit 75, the checkpoint named.
    {"sigterm_at_startup", 1, true, nullptr, Moment::startup, SIGTERM, SignalCase::kiln, 75},
    {"sigterm_mid_epoch", 1, true, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::kiln, 75},
    {"sigterm_during_commit", 1, true, nullptr, Moment::commit, SIGTERM, SignalCase::kiln, 75},
    {"sigusr1_mid_epoch", 1, true, "SIGUSR1", Moment::mid_epoch, SIGUSR1, SignalCase::kiln, 75},
    {"sigterm_at_startup", 2, true, nullptr, Moment::startup, SIGTERM, SignalCase::kiln, 75},
    {"sigterm_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::kiln, 75},
    {"sigterm_during_commit", 2, true, nullptr, Moment::commit, SIGTERM, SignalCase::kiln, 75},
    {"sigusr1_mid_epoch", 2, true, "SIGUSR1", Moment::mid_epoch, SIGUSR1, SignalCase::kiln, 75},
    // Any other signal interrupts: SIGTERM without [checkpoint], or when the
    // preemption signal is SIGUSR1.
    {"sigterm_at_startup_without_checkpoint", 1, false, nullptr, Moment::startup, SIGTERM, SignalCase::kiln, 130},
    {"sigterm_mid_epoch_without_checkpoint", 1, false, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::kiln, 130},
    {"sigterm_mid_epoch_when_sigusr1_preempts", 1, true, "SIGUSR1", Moment::mid_epoch, SIGTERM, SignalCase::kiln, 130},
    {"sigterm_at_startup_without_checkpoint", 2, false, nullptr, Moment::startup, SIGTERM, SignalCase::kiln, 130},
    {"sigterm_mid_epoch_without_checkpoint", 2, false, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::kiln, 130},
    {"sigterm_mid_epoch_when_sigusr1_preempts", 2, true, "SIGUSR1", Moment::mid_epoch, SIGTERM, SignalCase::kiln, 130},
    // Past kiln's launcher, to the ranks themselves: the same interruption
    // (exit 130, INTERRUPTED), or the same preemption.
    {"sigint_to_the_ranks_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGINT, SignalCase::ranks, 130},
    {"sigint_to_rank_1_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGINT, SignalCase::rank_1, 130},
    {"sigterm_to_the_ranks_without_checkpoint", 2, false, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::ranks, 130},
    {"sigterm_to_the_ranks_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::ranks, 75},
    // kiln and its ranks at once: each rank gets the signal twice (its own,
    // and the supervisor's forward), and takes them as one.
    {"sigint_to_everyone_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGINT, SignalCase::everyone, 130},
    {"sigterm_to_everyone_mid_epoch", 2, true, nullptr, Moment::mid_epoch, SIGTERM, SignalCase::everyone, 75},
};

INSTANTIATE_TEST_SUITE_P(OneAndTwoProcesses, Signals, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<SignalCase>& info) {
                           return std::string(info.param.name) + "_" + std::to_string(info.param.processes) + "p";
                         });

}  // namespace
}  // namespace kiln::test
