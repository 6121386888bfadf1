// Long runs that go on by themselves (distributed/restarts.hpp): `kiln fit
// --max-restarts N` restarts kiln's own workers from the newest committed
// checkpoint after a failure, and ends like a run that never failed: the
// same weights, bit for bit, and each step once in metrics.csv,
// metrics.jsonl and TensorBoard's file. What cannot heal (ranks that
// disagree, a crash loop, bad input) ends with its cause, unrestarted.
// `--resume auto` continues from the newest checkpoint or starts fresh, for
// torchrun's restarts and requeued jobs.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <random>
#include <regex>
#include <set>
#include <thread>

#include "common.hpp"
#include "loopback_port.hpp"
#include "logged_files.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

// 2 ranks, 128 samples, 4 a batch: 16 steps an epoch, 96 in all; a commit
// every 4 steps; each step sleeps, so a run lasts long enough to be killed.
std::filesystem::path restart_manifest(const TempDir& dir, const std::string& model_extra = "",
                                       const std::string& data_extra = "") {
  return recorder_manifest(dir, "features = 4\nstep_ms = 25\ndump_params = \"" + (dir / "params").string() + "\"\n" +
                                    model_extra,
                           "size = 128\nfeatures = 4\n" + data_extra, "",
                           "max_epochs = 6\nbatch_size = 4\nlog_every_n_steps = 2\n[optimizer]\nname = \"sgd\"\n"
                           "lr = 0.1\n[checkpoint]\nevery_n_steps = 4\nevery_n_epochs = 0\nsave_top_k = 1\n"
                           "[distributed]\nprocesses = 2\ntimeout_s = 30.0\n" +
                               std::string(kAllLoggers));
}

// The newest committed checkpoint's step in `dir` ("epoch=E-step=S.ckpt"), or -1.
int64_t newest_step(const std::filesystem::path& dir) {
  int64_t newest = -1;
  std::error_code ec;
  static const std::regex name(R"(epoch=\d+-step=(\d+)\.ckpt)");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, name)) newest = std::max<int64_t>(newest, std::stoll(m[1]));
  }
  return newest;
}

// The pid of the worker of rank `rank` among the processes of the run in
// `marker`, or 0 (a worker carries RANK in its environment; the supervisor not).
pid_t worker_pid(const std::string& marker, int rank) {
  for (pid_t p : processes_mentioning(marker)) {
    std::string env = read_file("/proc/" + std::to_string(p) + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (("\n" + env).find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos) return p;
  }
  return 0;
}

template <typename Condition>
bool wait_until(Condition condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(120 * timeout_scale());
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// metrics.csv without its timing columns.
std::vector<std::map<std::string, double>> csv_rows(const std::filesystem::path& file) {
  auto rows = read_metrics(file);
  for (auto& row : rows) erase_timings(row);
  return rows;
}

TEST(Restart, TwoProcessesKilledThreeTimesEndWithTheUninterruptedRunsWeightsAndEachStepOnce) {
  KILN_ONLY_IN_VARIANT("debian");
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir straight, killed;
  const ProcessResult s = kiln({"fit", restart_manifest(straight).string()}, {.timeout = kTimeout});
  ASSERT_EQ(s.exit_code, 0) << s.output;

  std::mt19937 random(std::random_device{}());
  const auto ckpt = killed / "run" / "checkpoints";
  const auto manifest = restart_manifest(killed);
  BackgroundRun run(killed, [&] { return kiln({"fit", manifest.string(), "--max-restarts", "3"}, {.timeout = kTimeout}); });
  int64_t resumed_at = -1;
  for (int kill = 1; kill <= 3; ++kill) {
    SCOPED_TRACE("kill " + std::to_string(kill));
    // A restart resumes from the newest commit: each attempt commits one
    // more before it dies, at a random step after it.
    ASSERT_TRUE(wait_until([&] { return newest_step(ckpt) > resumed_at; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 150)(random)));
    const int victim = std::uniform_int_distribution<int>(0, 1)(random);
    const pid_t pid = worker_pid(killed.path().string(), victim);
    ASSERT_GT(pid, 0) << "no worker of rank " << victim;
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    // The next attempt's workers are new processes.
    ASSERT_TRUE(wait_until([&] {
      const pid_t a = worker_pid(killed.path().string(), 0), b = worker_pid(killed.path().string(), 1);
      return a > 0 && b > 0 && a != pid && b != pid && newest_step(ckpt) >= 0;
    }));
    resumed_at = newest_step(ckpt);
  }
  const ProcessResult& r = run.result();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string n : {"1", "2", "3"})
    EXPECT_NE(r.output.find("restart " + n + "/3 after: rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL at step "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("; resuming from epoch="), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not restarting"), std::string::npos) << r.output;

  // The weights, bit for bit (float32 printed with 9 digits: exact).
  for (const std::string rank : {"0", "1"})
    EXPECT_EQ(read_file(killed / ("params." + rank)), read_file(straight / ("params." + rank))) << "rank " << rank;
  // Every file: each step once, the same rows as the uninterrupted run.
  const auto rows = jsonl_rows(killed / "run" / "metrics.jsonl");
  EXPECT_EQ(rows, jsonl_rows(straight / "run" / "metrics.jsonl"));
  EXPECT_EQ(std::set<std::string>(rows.begin(), rows.end()).size(), rows.size());
  EXPECT_EQ(csv_rows(killed / "run" / "metrics.csv"), csv_rows(straight / "run" / "metrics.csv"));
  expect_the_same_scalars(straight.path(), killed.path(), [](const std::string& tag) {
    return tag.rfind("train/loss", 0) == 0 || tag.rfind("val/", 0) == 0;
  });
}

// A failure that comes back before anything new is committed is a crash
// loop: one restart, then the run ends with the cause, not N more tries.
TEST(Restart, ACrashLoopEndsWithItsCauseAfterOneRestart) {
  TempDir dir;
  const ProcessResult r =
      kiln({"fit", restart_manifest(dir, "fail_at = [\"training_step\"]\nfail_on_rank = 1").string(), "--max-restarts",
            "3"},
           {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("restart 1/3 after: rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("starting over (no checkpoint committed yet)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 2/3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not restarting: no checkpoint was committed since restart 1"), std::string::npos) << r.output;
  const size_t last = r.output.rfind("kiln: error: ");
  ASSERT_NE(last, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("injected failure in training_step", last), std::string::npos) << r.output;
}

// Ranks that disagree at start-up disagree again after any restart.
TEST(Restart, RanksThatDisagreeAtStartUpAreNotRestarted) {
  TempDir dir;
  const ProcessResult r =
      kiln({"fit", restart_manifest(dir, "", "odd_rank_size = 132").string(), "--max-restarts", "3"}, {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.find("restart 1/3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not restarting: the ranks disagreed at the start-up agreement"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("differ in their data split lengths"), std::string::npos) << r.output;
}

TEST(Restart, BadCountsAndAutoForEvaluationAreRefusedWithOneLine) {
  TempDir dir;
  const auto manifest = restart_manifest(dir).string();
  for (const auto& args : std::vector<std::vector<std::string>>{{"fit", manifest, "--max-restarts", "-1"},
                                                                {"fit", manifest, "--max-restarts", "three"},
                                                                {"fit", manifest, "--set", "distributed.max_restarts=-2"},
                                                                {"validate", manifest, "--ckpt", "auto"}}) {
    const ProcessResult r = kiln(args, {.timeout = kTimeout});
    EXPECT_EQ(r.exit_code, 2) << args[2] << " " << args[3] << "\n" << r.output;
    EXPECT_NE(r.output.find("kiln: error: "), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "bad input writes nothing";
  }
}

// --- --resume auto under a torchrun-style launch ------------------------------------

// Two ranks started as torchrun starts them (its variables, one process
// each), the same command line; the outputs, rank by rank.
std::vector<ProcessResult> torchrun_style(const std::vector<std::string>& args) {
  const std::string port = std::to_string(loopback_port());
  std::vector<ProcessResult> out(2);
  auto launch = [&](int rank) {
    ProcessOptions o{.timeout = kTimeout};
    o.env = {{"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"},
             {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
             {"TORCHELASTIC_RUN_ID", "auto"}};
    out[rank] = kiln(args, o);
  };
  std::thread second([&] { launch(1); });
  launch(0);
  second.join();
  return out;
}

// The first launch finds no checkpoint and starts fresh; the job, requeued
// with the same command line, finds the newest and ends where one
// uninterrupted run ends.
TEST(ResumeAuto, ATorchrunStyleRelaunchContinuesFromTheNewestCheckpoint) {
  KILN_ONLY_IN_VARIANT("debian");
  TempDir straight, relaunched;
  // Nothing is killed here: the steps need not last.
  ASSERT_EQ(kiln({"fit", restart_manifest(straight).string(), "--set", "model.step_ms=0"}, {.timeout = kTimeout})
                .exit_code,
            0);
  const auto manifest = restart_manifest(relaunched).string();
  // The first launch is stopped after 3 epochs (the requeue's cause does not matter here).
  const auto first = torchrun_style(
      {"fit", manifest, "--resume", "auto", "--set", "trainer.max_epochs=3", "--set", "model.step_ms=0"});
  for (const auto& r : first) ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(first[0].output.find("--resume auto: no checkpoint in "), std::string::npos) << first[0].output;
  EXPECT_NE(first[0].output.find("; a fresh start"), std::string::npos) << first[0].output;
  const auto second = torchrun_style({"fit", manifest, "--resume", "auto", "--set", "model.step_ms=0"});
  for (const auto& r : second) ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(second[0].output.find("--resume auto: resuming from "), std::string::npos) << second[0].output;
  EXPECT_NE(second[0].output.find("(step 48)"), std::string::npos) << second[0].output;
  for (const std::string rank : {"0", "1"})
    EXPECT_EQ(read_file(relaunched / ("params." + rank)), read_file(straight / ("params." + rank))) << "rank " << rank;
}

}  // namespace
}  // namespace kiln::test
