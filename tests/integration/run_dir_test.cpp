// Nothing a user does by accident may change or corrupt a run (issue 18):
// one run directory, one run (a second run is refused at once, naming the
// directory and the holder's pid, and changes nothing; a SIGKILLed holder
// leaves no stale lock; `kiln inspect` and `kiln export` only read), and no
// shared-memory name outlives a run killed at any instant of its start-up.
// Real kiln processes; the holder is held still inside its first
// training_step by the recorder's wait_for, until the test writes "test:go".
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <fstream>
#include <iostream>
#include <random>
#include <set>

#include "common.hpp"
#include "launched.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(180);
const std::string kGo = "test:go";

void append_line(const std::filesystem::path& file, const std::string& line) {
  std::ofstream(file, std::ios::app) << line << "\n";
}

// A recorder run whose training_step waits (up to 60 s) for kGo in the log,
// with checkpoints every epoch and metrics.jsonl beside metrics.csv.
std::filesystem::path held_manifest(const TempDir& dir) {
  return recorder_manifest(dir, "wait_for = \"" + kGo + "\"", "size = 64", "",
                           "max_epochs = 2\nbatch_size = 4\ntest_after_fit = false\n"
                           "[checkpoint]\nevery_n_epochs = 1\n[logging]\nloggers = [\"csv\", \"jsonl\"]\n");
}

// The run's fit loop has begun (its run directory is open and locked, its
// files written as far as they are before the first step).
bool in_fit_loop(const TempDir& dir, int processes) {
  return read_file(dir / "calls.log").find(processes > 1 ? "callback@0:on_train_epoch_start" : "callback:on_train_epoch_start") !=
         std::string::npos;
}

bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';  // a zombie holds nothing
}

std::string refusal(const TempDir& dir, pid_t holder) {
  return "kiln: error: run directory " + (dir / "run").string() + " is in use by another run (pid " +
         std::to_string(holder) + "); wait for it to end, or give this run another run.dir\n";
}

class RunDirLock : public testing::TestWithParam<int> {};

// A fit holds its run directory: fit (fresh, resumed, with 2 processes),
// validate, test and predict on it are each refused at once with one line
// naming the directory and the holder's pid, exit 2, and leave every file as
// it was; inspect and export read it meanwhile. Then the holder finishes.
TEST_P(RunDirLock, ASecondRunIsRefusedNamingTheDirectoryAndTheHolderAndChangesNothing) {
  const int processes = GetParam();
  TempDir dir;
  const auto manifest = held_manifest(dir);
  const std::string m = manifest.string(), n = std::to_string(processes);
  // An earlier run's files: checkpoints, metrics.csv, metrics.jsonl.
  append_line(dir / "calls.log", kGo);
  const ProcessResult first = kiln({"fit", m, "-n", n}, {.timeout = kTimeout});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::filesystem::remove(dir / "calls.log");

  // The holder resumes them and stops in its first training_step.
  Launched holder(dir, {"fit", m, "-n", n, "--resume", "last", "--set", "trainer.max_epochs=3"}, dir / "holder.txt");
  ASSERT_TRUE(wait_until([&] { return in_fit_loop(dir, processes); })) << holder.output();
  const auto before = snapshot(dir / "run");
  ASSERT_TRUE(before.count("metrics.jsonl") && before.count("checkpoints/last.ckpt"));

  const std::vector<std::vector<std::string>> second{
      {"fit", m},        {"fit", m, "--resume", "last"}, {"fit", m, "-n", "2"},
      {"validate", m},   {"test", m},                    {"predict", m, "-n", "2"}};
  for (const auto& args : second) {
    const ProcessResult r = kiln(args, {.timeout = kTimeout});
    SCOPED_TRACE(args[0] + (args.size() > 2 ? " " + args[2] : ""));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, refusal(dir, holder.pid())) << "one line, nothing else";
  }
  // Only readers: they need no lock.
  const auto last = dir / "run" / "checkpoints" / "last.ckpt";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"inspect", m}, {"inspect", last.string()},
        {"export", last.string(), "-o", (dir / "weights.safetensors").string()}}) {
    const ProcessResult r = kiln(args, {.timeout = kTimeout});
    EXPECT_EQ(r.exit_code, 0) << args[0] << ": " << r.output;
  }
  EXPECT_EQ(snapshot(dir / "run"), before) << "a refused run must leave every file as it was";
  EXPECT_TRUE(std::filesystem::exists(dir / "weights.safetensors"));

  append_line(dir / "calls.log", kGo);
  const auto status = holder.wait();
  ASSERT_TRUE(status.has_value()) << holder.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << holder.output();
}

// SIGKILL leaves no stale lock: the kernel drops it with the holder (with 2
// processes, the supervisor; its workers die with it).
TEST_P(RunDirLock, ASigkilledHolderLeavesNoStaleLock) {
  const int processes = GetParam();
  TempDir dir;
  const auto manifest = held_manifest(dir);
  const std::string n = std::to_string(processes);
  Launched holder(dir, {"fit", manifest.string(), "-n", n}, dir / "holder.txt");
  ASSERT_TRUE(wait_until([&] { return in_fit_loop(dir, processes); })) << holder.output();
  // The directory did not exist when the run started: with 2 processes,
  // rank 0 took the lock as it created it (the supervisor holds it only when
  // it is there at start).
  const pid_t locker = processes > 1 ? wait_for_rank(dir / "calls.log", 0, 0) : holder.pid();
  const ProcessResult refused = kiln({"fit", manifest.string()}, {.timeout = kTimeout});
  ASSERT_EQ(refused.output, refusal(dir, locker));
  ::kill(holder.pid(), SIGKILL);
  ASSERT_TRUE(holder.wait().has_value());
  ASSERT_TRUE(wait_until([&] { return processes_mentioning(dir.path().string()).empty(); }));

  append_line(dir / "calls.log", kGo);
  const ProcessResult next = kiln({"fit", manifest.string(), "-n", n}, {.timeout = kTimeout});
  EXPECT_EQ(next.exit_code, 0) << next.output;
}

INSTANTIATE_TEST_SUITE_P(Processes, RunDirLock, testing::Values(1, 2),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_process" + (info.param > 1 ? "es" : "");
                         });

// Two runs started together on a directory that does not exist yet: one
// creates and locks it, the other is refused (exit 2) — at start if the
// directory is already there, else when it would create it — and the first
// trains on. One of them has 2 processes: its rank 0 takes the lock.
TEST(RunDirLockRace, TwoRunsStartedTogetherOnANewDirectoryOneIsRefused) {
  TempDir dir;
  const auto manifest = held_manifest(dir);
  Launched a(dir, {"fit", manifest.string()}, dir / "a.txt");
  Launched b(dir, {"fit", manifest.string(), "-n", "2"}, dir / "b.txt");
  ASSERT_TRUE(wait_until([&] { return a.ended() || b.ended(); })) << a.output() << b.output();
  Launched& refused = a.ended() ? a : b;
  Launched& winner = a.ended() ? b : a;
  ASSERT_TRUE(refused.exited_with(2)) << refused.output();
  EXPECT_NE(refused.output().find("kiln: error: run directory " + (dir / "run").string() + " is in use by another run (pid "),
            std::string::npos)
      << refused.output();
  EXPECT_FALSE(winner.ended()) << winner.output();
  append_line(dir / "calls.log", kGo);
  const auto status = winner.wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << winner.output();
}

// --- shared memory ------------------------------------------------------------

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 4 >= stat.size()) continue;
    if (std::atoi(stat.c_str() + paren + 4) == parent) out.push_back(std::stoi(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The gradient segment exists: a /dev/shm name of one of `pids` (POSIX
// shm_open's "kiln-<pid>-*"), or a descriptor of theirs on a /dev/shm file.
bool segment_exists(const std::vector<pid_t>& pids) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    for (pid_t p : pids)
      if (e.path().filename().string().rfind("kiln-" + std::to_string(p) + "-", 0) == 0) return true;
  for (pid_t p : pids)
    for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(p) + "/fd", ec)) {
      std::error_code link_ec;
      if (std::filesystem::read_symlink(fd.path(), link_ec).string().rfind("/dev/shm/", 0) == 0) return true;
    }
  return false;
}

std::vector<std::string> names_of(const std::set<pid_t>& pids) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename();
    for (pid_t p : pids)
      if (name.rfind("kiln-" + std::to_string(p) + "-", 0) == 0) out.push_back(name);
  }
  return out;
}

// SIGKILL to the supervisor or to rank 0 at random instants of a 2-process
// start-up — half of them at random delays after launch, half the moment the
// gradient segment is seen (when a name, had it one, would exist) — leaves
// no name in /dev/shm. 50 trials (KILN_TEST_SHM_TRIALS=N for more).
TEST(SharedMemory, NoNameOutlivesARunKilledAtRandomDuringStartUp) {
  KILN_ONLY_IN_VARIANT("debian");
  TempDir dir;
  const auto manifest = recorder_manifest(dir, "", "size = 64", "", "max_epochs = 1\nbatch_size = 4\n");
  const char* trials_env = std::getenv("KILN_TEST_SHM_TRIALS");
  const int trials = trials_env ? std::max(1, std::atoi(trials_env)) : 50;
  std::mt19937 rng(std::random_device{}());
  int seen = 0;
  std::set<pid_t> all;
  for (int trial = 0; trial < trials; ++trial) {
    const bool kill_supervisor = trial % 2 == 0;
    const bool at_sight = (trial / 2) % 2 == 0;
    const auto delay = std::chrono::microseconds(at_sight ? rng() % 3000 : rng() % 1'000'000);
    SCOPED_TRACE("trial " + std::to_string(trial) + (kill_supervisor ? ": the supervisor" : ": rank 0") +
                 (at_sight ? " at sight of the segment" : " at random") + ", +" + std::to_string(delay.count()) + " us");
    Launched run(dir, {"fit", manifest.string(), "-n", "2"}, dir / "out.txt");
    std::set<pid_t> pids{run.pid()};
    if (at_sight) {
      const bool sighted = wait_until(
          [&] {
            const auto workers = children_of(run.pid());
            pids.insert(workers.begin(), workers.end());
            return segment_exists(workers) || run.ended();
          },
          std::chrono::milliseconds(1));
      seen += sighted && !run.ended();
    }
    std::this_thread::sleep_for(delay);
    const auto workers = children_of(run.pid());
    pids.insert(workers.begin(), workers.end());
    // Rank 0 is forked first.
    const pid_t victim = kill_supervisor || workers.empty() ? run.pid() : workers.front();
    ::kill(victim, SIGKILL);
    ASSERT_TRUE(run.wait().has_value()) << run.output();
    ASSERT_TRUE(wait_until([&] {
      return std::all_of(pids.begin(), pids.end(), [](pid_t p) { return gone(p); });
    })) << "a process of the run outlived it";
    EXPECT_EQ(names_of(pids), std::vector<std::string>{});
    all.insert(pids.begin(), pids.end());
  }
  EXPECT_EQ(names_of(all), std::vector<std::string>{});
  std::cout << "killed " << trials << " start-ups; " << seen << " of them the moment the segment was seen\n";
  // The test reached the window it is about: most "at sight" trials saw the segment.
  EXPECT_GE(seen, trials / 8) << "the runs rarely reached the shared-memory set-up";
}

}  // namespace
}  // namespace kiln::test
