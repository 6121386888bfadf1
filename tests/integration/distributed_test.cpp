// Distributed runs with real processes on loopback: kiln's supervisor starts
// the workers, c10d (TCPStore + Gloo) connects them. Each test reproduces a
// pattern that deadlocks or misbehaves in Lightning and checks kiln does not.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <random>
#include <thread>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(180);

std::map<std::string, std::vector<double>> read_params(const std::filesystem::path& file) {
  std::map<std::string, std::vector<double>> out;
  std::istringstream in(read_file(file));
  for (std::string line; std::getline(in, line);) {
    std::istringstream cells(line);
    std::string name;
    cells >> name;
    for (double v; cells >> v;) out[name].push_back(v);
  }
  return out;
}

// Trains the recorder model in one process with batch 8 and in two with batch
// 4 each (`distributed` lines added to the second), both accumulating
// `accumulate` batches a step; the parameters each wrote.
struct OneAndTwo {
  std::map<std::string, std::vector<double>> single, rank0, rank1;
  std::string output;  // the two-process run's
};
OneAndTwo train_one_and_two(const std::string& distributed, int accumulate = 1) {
  TempDir one, two;
  const std::string model = "features = 4\ndump_params = \"" + (one / "params").string() + "\"";
  const std::string data = "size = 64\nfeatures = 4";
  const std::string trainer = "max_epochs = 3\ntest_after_fit = false\naccumulate_grad_batches = " +
                              std::to_string(accumulate) + "\n[optimizer]\nname = \"sgd\"\nlr = 0.5\n";
  auto run_one = kiln({"fit", recorder_manifest(one, model, data, "", "batch_size = 8\n" + trainer).string()},
                      {.timeout = kTimeout});
  EXPECT_EQ(run_one.exit_code, 0) << run_one.output;
  const std::string model2 = "features = 4\ndump_params = \"" + (two / "params").string() + "\"";
  auto run_two = kiln({"fit",
                       recorder_manifest(two, model2, data, "",
                                         "batch_size = 4\n" + trainer + "[distributed]\n" + distributed + "\n")
                           .string(),
                       "-n", "2", "--set", "run.log_level=debug"},
                      {.timeout = kTimeout});
  EXPECT_EQ(run_two.exit_code, 0) << run_two.output;
  if (run_one.exit_code != 0 || run_two.exit_code != 0) return {{}, {}, {}, run_two.output};
  // 64 samples / 8 per batch = 8 batches an epoch in both runs.
  EXPECT_EQ(read_metrics(two / "run" / "metrics.csv").back().at("step"), 24 / accumulate);
  return {read_params(one / "params.0"), read_params(two / "params.0"), read_params(two / "params.1"), run_two.output};
}

void expect_near(const std::map<std::string, std::vector<double>>& got,
                 const std::map<std::string, std::vector<double>>& want, double tolerance) {
  ASSERT_FALSE(want.empty());
  for (const auto& [name, values] : want) {
    ASSERT_EQ(got.at(name).size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(got.at(name)[i], values[i], tolerance) << name << "[" << i << "]";
  }
}

// Gradients between two ranks of this host: the shared-memory all-reduce
// (the default) and Gloo over loopback give what one process with the
// double batch gives.
class GradientTransport : public testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(GradientTransport, TwoProcessesMatchOneProcessWithTheDoubleBatch) {
  const auto [setting, transport] = GetParam();
  const OneAndTwo runs = train_one_and_two(setting);
  ASSERT_FALSE(runs.single.empty());
  EXPECT_NE(runs.output.find(std::string("gradients over ") + transport), std::string::npos) << runs.output;
  EXPECT_EQ(runs.rank0, runs.rank1) << "ranks must hold identical parameters";
  expect_near(runs.rank0, runs.single, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Transports, GradientTransport,
                         testing::Values(std::make_pair("", "shared memory"),
                                         std::make_pair("intra_host = \"shm\"", "shared memory"),
                                         std::make_pair("intra_host = \"gloo\"", "Gloo")),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "auto" : info.index == 1 ? "shm" : "gloo");
                         });

// Accumulating over micro-batches: the early ones skip the all-reduce
// (no_sync) and add into gradients that the Reducer, at the boundary, turns
// into views of its buckets. Those must be dropped after every optimizer
// step, or the next no_sync micro-batch adds to the last step's averaged
// gradients.
TEST(Distributed, GradientAccumulationOverTwoProcessesMatchesOneProcess) {
  const OneAndTwo runs = train_one_and_two("", /*accumulate=*/2);
  ASSERT_FALSE(runs.single.empty());
  EXPECT_EQ(runs.rank0, runs.rank1) << "ranks must hold identical parameters";
  expect_near(runs.rank0, runs.single, 1e-5);
}

// A /dev/shm too small for the segment (a container's): auto falls back to
// Gloo and trains; "shm" ends at start-up naming why, before any step.
TEST(Distributed, ASharedMemoryTooSmallFallsBackToGlooOrIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace (running as uid " << geteuid() << ")";
  auto in_small_shm = [](const std::vector<std::string>& args) {
    std::string command = "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$0\" \"$@\"";
    std::vector<std::string> argv{"/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c", command,
                                  kiln_exe().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, {.timeout = kTimeout});
  };
  const auto can = run_process({"/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c",
                                "mount -t tmpfs -o size=1m tmpfs /dev/shm"},
                               {.timeout = kTimeout});
  if (can.exit_code != 0) GTEST_SKIP() << "mount namespaces not permitted here: " << can.output;

  TempDir dir;
  const auto manifest = recorder_manifest(dir, "features = 4", "size = 64\nfeatures = 4", "",
                                          "max_epochs = 1\nbatch_size = 4\ntest_after_fit = false\n");
  auto fallback = in_small_shm({"fit", manifest.string(), "-n", "2"});
  EXPECT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("gradients over Gloo"), std::string::npos) << fallback.output;

  TempDir strict;
  const auto manifest2 = recorder_manifest(strict, "features = 4", "size = 64\nfeatures = 4", "",
                                           "max_epochs = 1\nbatch_size = 4\n[distributed]\nintra_host = \"shm\"\n");
  auto refused = in_small_shm({"fit", manifest2.string(), "-n", "2"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("distributed.intra_host = \"shm\", but the ranks cannot share memory: cannot reserve"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(read_file(strict / "calls.log").find("training_step"), std::string::npos) << "refused before any step";
}

// bf16/fp16 gradients: half the bytes; every rank still holds the same
// parameters, close to (and, rounded, not equal to) the float32 result.
class CompressedGradients : public testing::TestWithParam<const char*> {};

TEST_P(CompressedGradients, RanksAgreeAndStayCloseToFloat32) {
  const std::string dtype = GetParam();
  for (const char* intra_host : {"shm", "gloo"}) {
    SCOPED_TRACE(intra_host);
    const std::string setting = "gradient_compression = \"" + dtype + "\"\nintra_host = \"" + intra_host + "\"";
    if (dtype == "bf16" && std::string(intra_host) == "gloo") {
      // Gloo's bfloat16 sum depends on the LibTorch (Debian's 1.13 has none):
      // where it lacks one, the run says so before the first step.
      TempDir dir;
      auto r = kiln({"fit", recorder_manifest(dir, "features = 4", "size = 64\nfeatures = 4", "",
                                              "max_epochs = 1\nbatch_size = 4\n[distributed]\n" + setting + "\n")
                                .string(),
                     "-n", "2"},
                    {.timeout = kTimeout});
      if (r.exit_code != 0) {
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find("distributed.gradient_compression = \"bf16\": the Gloo all-reduce of this LibTorch "
                                "cannot sum BFloat16"),
                  std::string::npos)
            << r.output;
        continue;
      }
    }
    const OneAndTwo runs = train_one_and_two(setting);
    ASSERT_FALSE(runs.single.empty());
    EXPECT_EQ(runs.rank0, runs.rank1) << "ranks must hold identical parameters";
    expect_near(runs.rank0, runs.single, dtype == "bf16" ? 5e-2 : 5e-3);
    EXPECT_NE(runs.rank0, runs.single) << "compressed gradients are rounded: the result cannot be float32's exactly";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CompressedGradients, testing::Values("bf16", "fp16"));

TEST(Distributed, ValidationMetricsAreExactOverTheWholeSplit) {
  TempDir one, two;
  // 30 samples over 4 ranks does not divide: padding would double-count.
  const std::string data = "size = 30\nfeatures = 4";
  // `kiln validate` runs the initial weights (same seed) over the val split.
  const std::string extra = "batch_size = 4\n";
  ASSERT_EQ(kiln({"validate", recorder_manifest(one, "", data, "", extra).string()}, {.timeout = kTimeout}).exit_code, 0);
  auto r = kiln({"validate", recorder_manifest(two, "", data, "", extra).string(), "-n", "4"}, {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(read_metrics(two / "run" / "metrics.csv")[0].at("val/loss"),
              read_metrics(one / "run" / "metrics.csv")[0].at("val/loss"), 1e-6);
}

TEST(Distributed, DifferentModelOnOneRankEndsEveryRankWithTheDifferenceNamed) {
  TempDir dir;
  auto r = kiln({"fit", recorder_manifest(dir, "odd_rank_outputs = 3", "", "", "max_epochs = 1").string(), "-n", "2"},
                {.timeout = kTimeout});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 30 * timeout_scale()) << r.output;
  EXPECT_NE(r.output.find("ranks 0 and 1 differ in their model parameters: rank 0 has 'weight [2,4] Float', rank 1 "
                          "has 'weight [3,4] Float'"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(processes_mentioning(dir.path().string()).empty());
}

TEST(Distributed, MetricLoggedOnRankZeroOnlyDoesNotHang) {
  TempDir dir;
  auto r = kiln({"fit", recorder_manifest(dir, "rank0_metric = true", "", "", "max_epochs = 2").string(), "-n", "2"},
                {.timeout = kTimeout});
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("metric 'val/rank0_only' was recorded on rank(s) 0 only; reduced over those (rank(s) 1"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_metrics(dir / "run" / "metrics.csv")[0].at("val/rank0_only"), 1.0);
  // A metric flagged rank-zero-only is never synced, so no rank is named.
  EXPECT_EQ(r.output.find("metric 'val/rank0_flagged' was recorded"), std::string::npos) << r.output;
  EXPECT_EQ(read_metrics(dir / "run" / "metrics.csv")[0].at("val/rank0_flagged"), 2.0);
}

// ABI 1.1's tensor-valued metric: recorded without a read-back, reduced
// exactly as log_metric's values are, across ranks too.
class TensorMetric : public testing::TestWithParam<int> {};

TEST_P(TensorMetric, ReducesExactlyAsTheDoublePathForEveryReduction) {
  TempDir dir;
  auto r = kiln({"fit", recorder_manifest(dir, "tensor_metrics = true", "", "", "max_epochs = 2\nbatch_size = 3").string(),
                 "-n", std::to_string(GetParam())},
                {.timeout = kTimeout});
  ASSERT_FALSE(r.timed_out) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 2u) << r.output;
  for (const auto& row : rows)
    for (const char* reduce : {"mean", "sum", "max", "min"}) {
      const std::string tensor = std::string("val/tensor_") + reduce, value = std::string("val/double_") + reduce;
      ASSERT_TRUE(row.count(tensor) && row.count(value)) << reduce << "\n" << r.output;
      EXPECT_EQ(row.at(tensor), row.at(value)) << reduce;  // the same doubles, the same digits
    }
  // The batches differ (b and the rank are added), so the reductions do too.
  EXPECT_LT(rows[0].at("val/double_min"), rows[0].at("val/double_max"));
}

INSTANTIATE_TEST_SUITE_P(Processes, TensorMetric, testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "_process" + (info.param > 1 ? "es" : ""); });

TEST(Distributed, StopRequestedOnOneRankIsAgreedByAll) {
  TempDir dir;
  auto r = kiln({"fit",
                 recorder_manifest(dir, "", "", "stop_after_epoch = 1\nstop_on_rank = 1", "max_epochs = 10").string(),
                 "-n", "2"},
                {.timeout = kTimeout});
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_metrics(dir / "run" / "metrics.csv").size(), 2u) << r.output;
}

TEST(Distributed, ErrorOnOneRankRunsCleanupOnEveryRank) {
  TempDir dir;
  auto r = kiln({"fit",
                 recorder_manifest(dir, "fail_at = [\"training_step\"]\nfail_on_rank = 1", "", "", "max_epochs = 1")
                     .string(),
                 "-n", "2"},
                {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("kiln: error: rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed in training_step on rank 1: injected failure"), std::string::npos) << r.output;
  const std::string calls = read_file(dir / "calls.log");
  for (const char* line : {"model@1:on_exception(", "model@1:teardown(failed=1)", "model@1:destroy",
                           "data@0:teardown(failed=1)", "callback@0:destroy"})
    EXPECT_NE(calls.find(line), std::string::npos) << line << "\n" << calls;
  EXPECT_TRUE(processes_mentioning(dir.path().string()).empty());
}

struct Fault {
  const char* name;
  int signal;
  const char* expected;
  int victim;  // the rank that gets the signal
  const char* intra_host;  // how the gradients travel: "shm" or "gloo"
};

void PrintTo(const Fault& fault, std::ostream* out) {
  *out << fault.name << " to rank " << fault.victim << " (" << fault.intra_host << ")";
}

class FaultInjection : public testing::TestWithParam<Fault> {};

TEST_P(FaultInjection, StopsEveryRankWithinTimeoutPlusGraceAndLeavesNoProcess) {
  const Fault fault = GetParam();
  TempDir dir;
  const double timeout_s = 4;
  const auto manifest = recorder_manifest(dir, "", "size = 64", "",
                                          "max_epochs = 100000\nbatch_size = 4\n[distributed]\nprocesses = 2\n"
                                          "timeout_s = 4.0\nintra_host = \"" +
                                              std::string(fault.intra_host) + "\"\n");
  BackgroundRun run(dir, [&] { return kiln({"fit", manifest.string()}, {.timeout = kTimeout}); });
  std::mt19937 rng(std::random_device{}());
  const int victim = fault.victim;
  const int steps = 1 + static_cast<int>(rng() % 40);
  const pid_t pid = wait_for_rank(dir / "calls.log", victim, steps);
  ASSERT_GT(pid, 0) << "rank " << victim << " never ran " << steps << " steps";
  const auto injected = std::chrono::steady_clock::now();
  ::kill(pid, fault.signal);
  const ProcessResult& result = run.result();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - injected).count();
  SCOPED_TRACE("rank " + std::to_string(victim) + " after " + std::to_string(steps) + " steps");
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("kiln: error: rank " + std::to_string(victim) + " (pid " + std::to_string(pid) + ") " +
                               fault.expected),
            std::string::npos)
      << result.output;
  EXPECT_LT(seconds, timeout_s + 10 + 5 * timeout_scale()) << "collective timeout + grace (+ slack for a loaded machine)";
  EXPECT_TRUE(processes_mentioning(dir.path().string()).empty()) << "a process of the run is left behind";
}

INSTANTIATE_TEST_SUITE_P(KillARankAtARandomStep, FaultInjection,
                         testing::Values(Fault{"sigkill", SIGKILL, "was killed by SIGKILL", 0, "shm"},
                                         Fault{"sigkill", SIGKILL, "was killed by SIGKILL", 1, "shm"},
                                         Fault{"sigstop", SIGSTOP, "stopped responding", 0, "shm"},
                                         Fault{"sigstop", SIGSTOP, "stopped responding", 1, "shm"},
                                         Fault{"sigsegv", SIGSEGV, "was killed by SIGSEGV", 0, "shm"},
                                         Fault{"sigsegv", SIGSEGV, "was killed by SIGSEGV", 1, "shm"},
                                         Fault{"sigkill", SIGKILL, "was killed by SIGKILL", 1, "gloo"},
                                         Fault{"sigstop", SIGSTOP, "stopped responding", 0, "gloo"}),
                         [](const testing::TestParamInfo<Fault>& info) {
                           return std::string(info.param.name) + "_rank" + std::to_string(info.param.victim) + "_" +
                                  info.param.intra_host;
                         });

TEST(Distributed, SigintToTheSupervisorStopsEveryRankWithCleanup) {
  TempDir dir;
  const auto manifest = recorder_manifest(dir, "", "size = 64", "", "max_epochs = 100000\nbatch_size = 4\n");
  BackgroundRun run(dir, [&] { return kiln({"fit", manifest.string(), "-n", "2"}, {.timeout = kTimeout}); });
  ASSERT_GT(wait_for_rank(dir / "calls.log", 1, 5), 0);
  const auto supervisors = processes_mentioning(dir.path().string());
  // The supervisor is the one whose parent is not a kiln process: the test's child.
  for (pid_t p : supervisors) {
    const std::string stat = read_file("/proc/" + std::to_string(p) + "/stat");
    const pid_t parent = std::stoi(stat.substr(stat.rfind(')') + 4));
    if (parent == getpid()) ::kill(p, SIGINT);
  }
  const ProcessResult& result = run.result();
  EXPECT_EQ(result.exit_code, 130) << result.output;
  const std::string calls = read_file(dir / "calls.log");
  for (const char* line : {"model@0:teardown(failed=1)", "model@1:teardown(failed=1)", "data@1:destroy"})
    EXPECT_NE(calls.find(line), std::string::npos) << line;
  EXPECT_TRUE(processes_mentioning(dir.path().string()).empty());
}

}  // namespace
}  // namespace kiln::test
