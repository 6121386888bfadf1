// The host's concurrent parts, in-process, so that ThreadSanitizer can watch
// them (./go test --tsan): the prefetcher (with a fake data module, no
// dlopen), the asynchronous checkpoint commit, the signal watcher, the
// heartbeat and the supervisor (whose workers are this test binary,
// re-executed in a worker mode).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "ckpt/background_commit.hpp"
#include "distributed/heartbeat.hpp"
#include "distributed/restarts.hpp"
#include "distributed/supervisor.hpp"
#include "kiln/tensor.hpp"
#include "plugin/host_objects.hpp"
#include "plugin/plugin_instance.hpp"
#include "plugin/run_services.hpp"
#include "data/prefetcher.hpp"
#include "data/sampled_batches.hpp"
#include "util/activity.hpp"
#include "util/errors.hpp"
#include "util/signal_watcher.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// --- worker mode: this binary as a supervised worker ----------------------------
// supervise() re-executes /proc/self/exe; with KILN_TEST_WORKER_MODE set, the
// process acts out one worker behaviour here, before gtest ever starts.
int rank_from_env() {
  const char* r = std::getenv("RANK");
  return r ? std::atoi(r) : 0;
}

[[noreturn]] void worker_main(const std::string& mode) {
  kiln::Heartbeat heartbeat;
  const int rank = rank_from_env();
  heartbeat.phase("fit");
  if (mode == "ok") {
    std::this_thread::sleep_for(200ms);
    heartbeat.done();
    std::_Exit(0);
  }
  if (mode == "exit0_on_rank1" && rank == 1) std::_Exit(0);  // no "@done": it left early
  if (mode == "fail_on_rank0" && rank == 0) {
    heartbeat.report_failure(true, "boom on rank 0");
    std::_Exit(1);
  }
  // Rank 1 reaches step 7 and dies by SIGKILL, unless it was restarted
  // (the supervisor names a checkpoint to resume from).
  if (mode == "killed_unless_restarted") {
    heartbeat.activity()->at_step(7);
    std::this_thread::sleep_for(1500ms);  // a beat carries the step
    const char* from = std::getenv(kiln::kResumeFromVariable);
    if (from == nullptr || std::string(from) != "/ckpt/step-7.ckpt") {
      if (rank == 1) ::raise(SIGKILL);
      for (;;) std::this_thread::sleep_for(1s);
    }
    heartbeat.done();
    std::_Exit(0);
  }
  if (mode == "hang_on_rank1") {
    const char* marker = std::getenv("KILN_TEST_MARKER");
    if (rank == 1) {
      ::signal(SIGTERM, SIG_IGN);  // stuck for good: only SIGKILL ends it
      heartbeat.activity()->enter("training_step");
      if (marker) ::close(::open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
      for (;;) std::this_thread::sleep_for(1s);
    }
    // Rank 0's collective "times out" once rank 1 is in its hook (however
    // late its start), and long enough after for rank 1's heartbeat to have
    // reported it busy there (from 2 s in the hook on, one beat a second).
    for (int i = 0; i < 1200 && marker && ::access(marker, F_OK) != 0; ++i) std::this_thread::sleep_for(100ms);
    std::this_thread::sleep_for(5s);
    heartbeat.report_failure(false, "all-reduce failed (another rank failed or stopped responding)");
    std::_Exit(1);
  }
  for (;;) std::this_thread::sleep_for(1s);  // the others wait until stopped (SIGTERM)
}

// kiln's main() makes the watcher before any other thread exists; a process
// signal reaches whichever thread does not block it. This test binary has
// LibTorch's and earlier tests' threads by the time a test runs, so the
// watcher is checked in a fresh copy of the binary, as in kiln's main().
// Exit 0: the flag said SIGUSR1 and a write to a closed pipe failed with EPIPE.
[[noreturn]] void signal_watcher_main() {
  kiln::SignalWatcher watcher;
  if (watcher.signal()->load() != 0) std::_Exit(3);
  ::kill(::getpid(), SIGUSR1);
  const auto until = Clock::now() + 20s;
  while (watcher.signal()->load() == 0 && Clock::now() < until) std::this_thread::sleep_for(10ms);
  if (watcher.signal()->load() != SIGUSR1) std::_Exit(4);
  int fds[2];
  if (::pipe(fds) != 0) std::_Exit(5);
  ::close(fds[0]);
  if (::write(fds[1], "x", 1) != -1 || errno != EPIPE) std::_Exit(6);
  std::_Exit(0);
}

const bool g_worker = [] {
  if (const char* mode = std::getenv("KILN_TEST_WORKER_MODE"); mode && *mode) {
    if (std::string(mode) == "signal_watcher") signal_watcher_main();
    worker_main(mode);
  }
  return false;
}();

kiln::SupervisorOptions worker_options() {
  kiln::SupervisorOptions options;
  options.processes = 2;
  options.argv = {"/proc/self/exe"};
  options.startup_timeout = 30s;
  options.heartbeat_timeout = 10s;
  options.grace = 2s;
  return options;
}

kiln::SupervisorResult supervise_workers(const std::string& mode) {
  ::setenv("KILN_TEST_WORKER_MODE", mode.c_str(), 1);
  // A file one worker creates for another to wait on (sequencing, not time).
  const std::string marker = "/tmp/kiln-test-marker-" + std::to_string(::getpid());
  ::unlink(marker.c_str());
  ::setenv("KILN_TEST_MARKER", marker.c_str(), 1);
  kiln::SupervisorOptions options = worker_options();
  const std::atomic<int> no_signal{0};
  auto result = kiln::supervise(options, &no_signal);
  ::unsetenv("KILN_TEST_WORKER_MODE");
  ::unsetenv("KILN_TEST_MARKER");
  ::unlink(marker.c_str());
  return result;
}

TEST(Supervisor, WorkersThatFinishAreASuccess) {
  const auto r = supervise_workers("ok");
  EXPECT_EQ(r.exit_code, 0) << r.report;
}

TEST(Supervisor, ARankThatExitsZeroEarlyIsTheCause) {
  const auto r = supervise_workers("exit0_on_rank1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.report.find("rank 1 (pid"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("exited early with code 0 during fit"), std::string::npos) << r.report;
}

TEST(Supervisor, AWorkersOwnReportIsTheCause) {
  const auto r = supervise_workers("fail_on_rank0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.report.find("rank 0 (pid"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("boom on rank 0"), std::string::npos) << r.report;
}

TEST(Supervisor, AHungRankIsReportedAsHungNotAsTheSupervisorsKill) {
  const auto r = supervise_workers("hang_on_rank1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.report.find("rank 1 (pid"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("hung in training_step"), std::string::npos) << r.report;
  EXPECT_EQ(r.report.find("SIGKILL"), std::string::npos) << r.report;
}

// --- restarts (distributed/restarts.hpp) --------------------------------------------

TEST(Supervisor, AKilledRankIsReportedWithTheStepItReached) {
  const auto r = supervise_workers("killed_unless_restarted");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.report.find("rank 1 (pid"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("was killed by SIGKILL at step 7"), std::string::npos) << r.report;
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.phase, "fit");
  EXPECT_FALSE(r.reported);
}

TEST(Restarts, AFailureRestartsTheWorkersFromTheNewestCheckpoint) {
  ::setenv("KILN_TEST_WORKER_MODE", "killed_unless_restarted", 1);
  int looked = 0;
  kiln::RestartPlan plan;
  plan.max_restarts = 2;
  // Nothing at the start; step 7 committed by the time rank 1 dies.
  plan.newest = [&]() -> std::optional<kiln::CommittedCheckpoint> {
    if (looked++ == 0) return std::nullopt;
    return kiln::CommittedCheckpoint{"/ckpt/step-7.ckpt", 7};
  };
  const std::atomic<int> no_signal{0};
  const auto r = kiln::supervise_with_restarts(worker_options(), &no_signal, plan);
  ::unsetenv("KILN_TEST_WORKER_MODE");
  EXPECT_EQ(r.exit_code, 0) << r.report;
  EXPECT_EQ(looked, 2) << "once before the first start, once after the failure";
}

TEST(Restarts, AFailureWithNothingCommittedSinceTheLastRestartEndsTheRun) {
  ::setenv("KILN_TEST_WORKER_MODE", "killed_unless_restarted", 1);
  int looked = 0;
  kiln::RestartPlan plan;
  plan.max_restarts = 5;
  plan.first_resume = "/ckpt/step-3.ckpt";
  plan.newest = [&]() -> std::optional<kiln::CommittedCheckpoint> {
    ++looked;
    return kiln::CommittedCheckpoint{"/ckpt/step-3.ckpt", 3};  // never moves
  };
  const std::atomic<int> no_signal{0};
  const auto r = kiln::supervise_with_restarts(worker_options(), &no_signal, plan);
  ::unsetenv("KILN_TEST_WORKER_MODE");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.report.find("was killed by SIGKILL at step 7"), std::string::npos) << r.report;
  EXPECT_EQ(looked, 3) << "two attempts: the first restart is free, the second needs a new commit";
}

TEST(Restarts, WhatCannotHealIsNeverRestarted) {
  kiln::SupervisorResult failed;
  failed.exit_code = 1;
  failed.rank = 1;
  failed.phase = "fit";
  EXPECT_EQ(kiln::why_not_restart(failed, 0, 3, false), std::nullopt);
  EXPECT_EQ(kiln::why_not_restart(failed, 2, 3, true), std::nullopt);
  EXPECT_NE(kiln::why_not_restart(failed, 3, 3, true), std::nullopt);
  EXPECT_NE(kiln::why_not_restart(failed, 1, 3, false)->find("crash loop"), std::string::npos);
  EXPECT_EQ(*kiln::why_not_restart(failed, 0, 0, true), "") << "no restarts asked for: nothing to say";
  auto with = [&](int code, int rank, std::string phase, bool reported) {
    kiln::SupervisorResult r = failed;
    r.exit_code = code;
    r.rank = rank;
    r.phase = std::move(phase);
    r.reported = reported;
    return kiln::why_not_restart(r, 0, 3, true);
  };
  EXPECT_NE(with(2, 0, "fit", true)->find("bad input"), std::string::npos);
  EXPECT_NE(with(75, 0, "fit", true)->find("preempted"), std::string::npos);
  EXPECT_NE(with(130, -1, "", false), std::nullopt);
  EXPECT_NE(with(1, 0, "start-up agreement", true)->find("start-up agreement"), std::string::npos);
  // A rank killed during the agreement (a node lost) said nothing: that can heal.
  EXPECT_EQ(with(1, 1, "start-up agreement", false), std::nullopt);
}

// --- heartbeat -------------------------------------------------------------------

// Reads what the heartbeat wrote until `want` appears (bounded: 20 s).
std::string read_until(int fd, const std::string& want) {
  std::string got;
  const auto until = Clock::now() + 20s;
  while (got.find(want) == std::string::npos && Clock::now() < until) {
    char buffer[256];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0)
      got.append(buffer, static_cast<size_t>(n));
    else
      std::this_thread::sleep_for(20ms);
  }
  return got;
}

TEST(Heartbeat, BeatsAndTellsPhasesHooksFailuresAndDone) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_NONBLOCK), 0);
  ::setenv("KILN_HEARTBEAT_FD", std::to_string(fds[1]).c_str(), 1);
  {
    kiln::Heartbeat heartbeat;
    ::unsetenv("KILN_HEARTBEAT_FD");
    ASSERT_TRUE(heartbeat.connected());
    EXPECT_NE(read_until(fds[0], std::string(1, kiln::heartbeat::kBeat)).find(kiln::heartbeat::kBeat), std::string::npos);
    heartbeat.phase("rendezvous");
    EXPECT_NE(read_until(fds[0], "@phase rendezvous\n").find("@phase rendezvous\n"), std::string::npos);
    {
      kiln::InHook in(heartbeat.activity(), "training_step");  // and stays there
      EXPECT_NE(read_until(fds[0], " training_step\n").find("@busy "), std::string::npos);
    }
    heartbeat.report_failure(true, "two\nlines");
    EXPECT_NE(read_until(fds[0], "!1 two lines\n").find("!1 two lines\n"), std::string::npos);
    heartbeat.done();
    EXPECT_NE(read_until(fds[0], "@done\n").find("@done\n"), std::string::npos);
  }
  ::close(fds[0]);
}

// --- signal watcher ------------------------------------------------------------------

TEST(SignalWatcher, TurnsAProcessSignalIntoTheFlagAndIgnoresSigpipe) {
  // The environment is built before fork: the child only calls execve.
  std::string mode = "KILN_TEST_WORKER_MODE=signal_watcher";
  std::vector<char*> env{mode.data()};
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back(nullptr);
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, nullptr};
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execve(exe, argv, env.data());
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "killed by signal " << WTERMSIG(status) << " (the watcher did not take it)";
  ASSERT_TRUE(WIFEXITED(status));
  // 3: the flag was set before any signal; 4: SIGUSR1 never reached the flag;
  // 5/6: a write to a closed pipe did not fail with EPIPE.
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// --- prefetcher ----------------------------------------------------------------------

// A data module whose get_batch puts the first index of its batch in "i",
// fails at batch `fail_at`, and blocks at batch `block_at` until released.
struct FakeData {
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false;
  int64_t fail_at = -1, block_at = -1;
  std::atomic<int> blocked{0};
  const kiln_host* host = nullptr;
  // Where get_batch ran, and how long it takes there (microseconds).
  std::thread::id main_thread = std::this_thread::get_id();
  std::atomic<int> on_main{0}, off_main{0};
  int64_t sleep_us_on_main = 0, sleep_us_off_main = 0;
} g_data;

kiln_error* fake_create(const kiln_host* host, const char*, kiln_instance** out) {
  g_data.host = host;
  *out = reinterpret_cast<kiln_instance*>(&g_data);
  return nullptr;
}
void fake_destroy(kiln_instance*) {}
kiln_error* fake_length(kiln_instance*, kiln_split, int64_t* out) {
  *out = 1000;
  return nullptr;
}
kiln_error* fake_get_batch(kiln_instance*, kiln_split, const int64_t* indices, size_t, kiln_batch** out) {
  const kiln_host* host = g_data.host;
  const bool on_main = std::this_thread::get_id() == g_data.main_thread;
  ++(on_main ? g_data.on_main : g_data.off_main);
  if (const int64_t us = on_main ? g_data.sleep_us_on_main : g_data.sleep_us_off_main)
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  if (indices[0] == g_data.fail_at) return host->error_new(host, "no such sample");
  if (indices[0] == g_data.block_at) {
    ++g_data.blocked;
    std::unique_lock<std::mutex> lock(g_data.mutex);
    g_data.released_cv.wait(lock, [] { return g_data.released; });
  }
  kiln_batch* batch = host->batch_new(host);
  host->batch_put(host, batch, "i", kiln::release_tensor(at::scalar_tensor(indices[0], at::kLong)));
  *out = batch;
  return nullptr;
}

const kiln_lifecycle kLifecycle{sizeof(kiln_lifecycle), &fake_create, nullptr, nullptr, nullptr, nullptr, nullptr,
                                &fake_destroy};
const kiln_data_hooks kHooks{sizeof(kiln_data_hooks), nullptr, &fake_length, &fake_get_batch};
const kiln_descriptor kConcurrent{sizeof(kiln_descriptor), "test.fake_data", "fake", "1", nullptr,
                                  KILN_KIND_DATA_MODULE, nullptr, KILN_DATA_CONCURRENT_GET_BATCH, &kLifecycle, &kHooks};

struct NoRun : kiln::RunServices {
  void record_metric(const std::string&, const char*, double, double, uint32_t) override {}
  void record_metric_tensor(const std::string&, const char*, const at::Tensor&, double, uint32_t) override {}
  bool metric(const char*, double*) const override { return false; }
  void request_stop(const std::string&, const char*) override {}
  int32_t rank() const override { return 0; }
  int32_t world_size() const override { return 1; }
};

kiln::BatchPlan plan_of(int batches) {
  kiln::BatchPlan plan;
  plan.offsets.push_back(0);
  for (int b = 0; b < batches; ++b) {
    plan.indices.push_back(b);
    plan.offsets.push_back(plan.indices.size());
  }
  return plan;
}

class PrefetcherTest : public testing::Test {
 protected:
  void SetUp() override {
    g_data.fail_at = g_data.block_at = -1;
    g_data.released = false;
    g_data.blocked = 0;
    g_data.main_thread = std::this_thread::get_id();
    g_data.on_main = g_data.off_main = 0;
    g_data.sleep_us_on_main = g_data.sleep_us_off_main = 0;
    kiln::LoadedPlugin plugin;
    plugin.descriptor = &kConcurrent;
    plugin.path = "fake";
    plugin.slot = "data";
    instance = std::make_unique<kiln::PluginInstance>(plugin, "", &run);
    instance->create();
  }
  NoRun run;
  std::unique_ptr<kiln::PluginInstance> instance;
};

int64_t index_of(const kiln::BatchPtr& batch) { return batch->tensors.at(0).second.item<int64_t>(); }

// All of a plan of `n` batches, on `threads` threads.
kiln::Prefetcher prefetch_all(const kiln::PluginInstance& data, int n, int threads, int depth) {
  auto plan = std::make_shared<const kiln::BatchPlan>(plan_of(n));
  return kiln::Prefetcher(kiln::BatchRequest{data, KILN_SPLIT_TRAIN, plan, {}}, 0, static_cast<size_t>(n), threads,
                          depth);
}

TEST_F(PrefetcherTest, HandsBatchesBackInPlanOrderFromSeveralThreads) {
  kiln::Prefetcher prefetcher = prefetch_all(*instance, 200, /*threads=*/3, /*depth=*/4);
  for (int b = 0; b < 200; ++b) ASSERT_EQ(index_of(prefetcher.next()), b);
}

TEST_F(PrefetcherTest, AGetBatchErrorIsRethrownWhenItsBatchIsTaken) {
  g_data.fail_at = 7;
  kiln::Prefetcher prefetcher = prefetch_all(*instance, 20, 2, 4);
  for (int b = 0; b < 7; ++b) ASSERT_EQ(index_of(prefetcher.next()), b);
  try {
    prefetcher.next();
    FAIL() << "batch 7 failed in get_batch";
  } catch (const kiln::HookError& e) {
    EXPECT_EQ(e.hook(), "get_batch");
    EXPECT_EQ(e.message(), "no such sample (batch 7 of the epoch: sample 7)");
  }
}

// The consumer wakes sleeping workers only at the ring's low-water mark:
// every batch still arrives, in order, whatever the depth and thread count,
// and a range [first, last) of the plan is exactly those batches.
// try_next (the CUDA path's look-ahead) never waits: a batch not yet ready,
// or one whose get_batch failed, is left for next().
TEST_F(PrefetcherTest, TryNextTakesOnlyAReadyBatchAndLeavesAnErrorForNext) {
  g_data.fail_at = 3;
  kiln::Prefetcher prefetcher = prefetch_all(*instance, 6, 1, 4);
  for (int b = 0; b < 3; ++b) {
    kiln::BatchPtr batch;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(batch = prefetcher.try_next()) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(batch) << "batch " << b << " was never ready";
    EXPECT_EQ(index_of(std::move(batch)), b);
  }
  // Batch 3 failed: try_next leaves it however long it waits.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(prefetcher.try_next());
  EXPECT_THROW(prefetcher.next(), kiln::HookError);
}

TEST_F(PrefetcherTest, HandsARangeBackInOrderAtEveryDepthAndThreadCount) {
  auto plan = std::make_shared<const kiln::BatchPlan>(plan_of(120));
  for (int depth : {1, 2, 3, 4, 7})
    for (int threads : {1, 2, 3}) {
      kiln::Prefetcher prefetcher(kiln::BatchRequest{*instance, KILN_SPLIT_TRAIN, plan, {}}, 17, 101, threads, depth);
      ASSERT_EQ(prefetcher.size(), 84u);
      for (int b = 17; b < 101; ++b) ASSERT_EQ(index_of(prefetcher.next()), b) << depth << " " << threads;
      EXPECT_THROW(prefetcher.next(), std::logic_error);
    }
}

TEST_F(PrefetcherTest, GatheringInlineCallsGetBatchOnThisThreadAndNamesThePluginOnError) {
  g_data.fail_at = 3;
  const kiln::BatchRequest request{*instance, KILN_SPLIT_TRAIN, std::make_shared<const kiln::BatchPlan>(plan_of(5)), {}};
  kiln::Activity activity;
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(index_of(kiln::gather_inline(request, b, &activity)), static_cast<int64_t>(b));
  EXPECT_EQ(g_data.on_main.load(), 3);
  EXPECT_EQ(g_data.off_main.load(), 0);
  EXPECT_EQ(activity.snapshot().moves, 6u) << "each call is marked for the heartbeat (enter and leave)";
  try {
    kiln::gather_inline(request, 3, &activity);
    FAIL() << "batch 3 failed in get_batch";
  } catch (const kiln::HookError& e) {
    EXPECT_EQ(e.plugin_id(), "test.fake_data");
    EXPECT_EQ(e.hook(), "get_batch");
    EXPECT_EQ(e.message(), "no such sample (batch 3 of the epoch: sample 3)");
  }
  EXPECT_EQ(instance->calls_in_flight(), 0);
}

// --- sampled batches: trainer.data_workers ------------------------------------------------

// Every batch of an epoch of `batches` (batch size 1, in order), taken with
// `step_us` of "training" after each; returns the indices seen.
std::vector<int64_t> run_epoch(kiln::SampledBatches& batches, int64_t epoch, int64_t count, int step_us = 0) {
  kiln::EpochSpec spec;
  spec.shuffle = false;
  spec.batch_size = 1;
  spec.limit.is_fraction = false;
  spec.limit.count = count;
  auto stream = batches.open(KILN_SPLIT_TRAIN, spec, epoch, 0);
  std::vector<int64_t> seen;
  for (int64_t b = 0; b < stream->size(); ++b) {
    seen.push_back(index_of(stream->next()));
    if (step_us) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
  }
  return seen;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

// data_workers: 0 inline, 1 a thread, -1 auto.
kiln::SamplingSettings sampling(int data_workers) {
  kiln::SamplingSettings s;
  s.data_workers = data_workers;
  s.trial = kiln::FetchTrialShape{2, 6, 2};  // 2 + 4 x 6 = 26 batches
  s.cores = at::get_num_threads() + 1;       // a core left over: auto runs its trial
  return s;
}

TEST_F(PrefetcherTest, PrefetchInlineGathersEveryBatchOnTheMainThreadInOrder) {
  kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), sampling(0),
                               c10::Device(c10::kCPU));
  EXPECT_EQ(run_epoch(batches, 0, 40), iota(40));
  EXPECT_EQ(g_data.on_main.load(), 40);
  EXPECT_EQ(g_data.off_main.load(), 0);
  EXPECT_EQ(batches.trial(), nullptr);
}

TEST_F(PrefetcherTest, PrefetchThreadGathersEveryBatchOffTheMainThreadInOrder) {
  kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), sampling(1),
                               c10::Device(c10::kCPU));
  EXPECT_EQ(run_epoch(batches, 0, 40), iota(40));
  EXPECT_EQ(g_data.on_main.load(), 0);
  EXPECT_EQ(g_data.off_main.load(), 40);
}

// get_batch takes as long as a step: a prefetch thread hides it, inline adds
// it to every step. Sleeps, not work, so a loaded machine gives the same
// answer. The order survives the switches between the trial's segments.
TEST_F(PrefetcherTest, PrefetchAutoKeepsTheThreadWhenItIsMeasuredFaster) {
  g_data.sleep_us_on_main = g_data.sleep_us_off_main = 3000;
  kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), sampling(-1),
                               c10::Device(c10::kCPU));
  ASSERT_NE(batches.trial(), nullptr);
  EXPECT_EQ(run_epoch(batches, 0, 30, /*step_us=*/3000), iota(30));
  EXPECT_FALSE(batches.trial()->running());
  EXPECT_EQ(batches.mode(), kiln::FetchMode::thread) << batches.trial()->verdict();
  EXPECT_GT(g_data.on_main.load(), 0) << "the trial's inline windows ran";
  const int on_main = g_data.on_main.load();
  EXPECT_EQ(run_epoch(batches, 1, 30), iota(30));
  EXPECT_EQ(g_data.on_main.load(), on_main) << "after the decision, every batch comes from the thread";
}

// get_batch is slow only off the main thread (a stand-in for a prefetch
// thread that has to wait for a core): inline wins.
TEST_F(PrefetcherTest, PrefetchAutoGathersInlineWhenThatIsMeasuredFaster) {
  g_data.sleep_us_off_main = 6000;
  kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), sampling(-1),
                               c10::Device(c10::kCPU));
  EXPECT_EQ(run_epoch(batches, 0, 30, /*step_us=*/1000), iota(30));
  EXPECT_EQ(batches.mode(), kiln::FetchMode::inline_) << batches.trial()->verdict();
  const int off_main = g_data.off_main.load();
  EXPECT_EQ(run_epoch(batches, 1, 30), iota(30));
  EXPECT_EQ(g_data.off_main.load(), off_main) << "after the decision, every batch is gathered inline";
}

// Intra-op threads that fill the cores: a prefetch thread could only take
// cores from them, so auto gathers inline without trying it.
TEST_F(PrefetcherTest, PrefetchAutoGathersInlineWithoutATrialWhenTheIntraOpThreadsFillTheCores) {
  kiln::SamplingSettings s = sampling(-1);
  s.cores = at::get_num_threads();
  kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), s, c10::Device(c10::kCPU));
  EXPECT_EQ(batches.trial(), nullptr);
  EXPECT_EQ(batches.mode(), kiln::FetchMode::inline_);
  EXPECT_EQ(run_epoch(batches, 0, 30), iota(30));
  EXPECT_EQ(g_data.on_main.load(), 30);
  EXPECT_EQ(g_data.off_main.load(), 0);
}

// A core left over beside the intra-op threads runs the trial, as
// docs/manifest.md says: the worker threads are what its thread windows
// time. (It once went inline untried, with a log line saying the intra-op
// threads filled the cores.)
TEST_F(PrefetcherTest, PrefetchAutoRunsItsTrialWhenACoreIsLeftOver) {
  kiln::SamplingSettings s = sampling(-1);  // cores: the intra-op threads + 1
  kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), s, c10::Device(c10::kCPU));
  ASSERT_NE(batches.trial(), nullptr) << "a core is left over: auto runs its trial";
  EXPECT_EQ(run_epoch(batches, 0, 30), iota(30));
  EXPECT_GT(g_data.on_main.load(), 0) << "the trial's inline windows ran";
  EXPECT_GT(g_data.off_main.load(), 0) << "the trial's thread windows ran";
}

// An error from get_batch surfaces with the data module named, whichever way
// the batch was fetched: in a trial window of either mode.
TEST_F(PrefetcherTest, PrefetchAutoReportsAGetBatchErrorInEitherMode) {
  for (int64_t fail_at : {4, 10}) {  // the first (inline) window; the second (thread)
    g_data.fail_at = fail_at;
    kiln::SampledBatches batches(kiln::DataModuleProxy(*instance), sampling(-1),
                                 c10::Device(c10::kCPU));
    try {
      run_epoch(batches, 0, 30);
      FAIL() << "batch " << fail_at << " failed in get_batch";
    } catch (const kiln::HookError& e) {
      EXPECT_EQ(e.plugin_id(), "test.fake_data");
      EXPECT_EQ(e.hook(), "get_batch");
      EXPECT_EQ(e.message(), "no such sample (batch " + std::to_string(fail_at) + " of the epoch: sample " + std::to_string(fail_at) + ")");
    }
  }
  EXPECT_GT(g_data.off_main.load(), 0);
}

TEST_F(PrefetcherTest, AStuckGetBatchIsAbandonedWhenTheRunFails) {
  g_data.block_at = 1;
  const auto started = Clock::now();
  try {
    kiln::Prefetcher prefetcher = prefetch_all(*instance, 10, 1, 2);
    EXPECT_EQ(index_of(prefetcher.next()), 0);
    while (g_data.blocked.load() == 0) std::this_thread::sleep_for(1ms);
    throw std::runtime_error("training_step failed");  // unwinding destroys the prefetcher
  } catch (const std::runtime_error&) {
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  EXPECT_LT(seconds, 60) << "a bound against hangs: the destructor did not join the stuck thread";
  EXPECT_EQ(instance->calls_in_flight(), 1);
  {
    std::lock_guard<std::mutex> lock(g_data.mutex);
    g_data.released = true;
  }
  g_data.released_cv.notify_all();
  const auto until = Clock::now() + 20s;
  while (instance->calls_in_flight() > 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(instance->calls_in_flight(), 0);
  std::this_thread::sleep_for(50ms);  // the abandoned thread drops its batch and ends
}

// --- the asynchronous checkpoint commit ---------------------------------------

// A commit the test lets go when it wants.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    cv.notify_all();
  }
};

TEST(BackgroundCommit, AFailureIsSeenOnlyOnceTheWriteHasEndedAndIsTakenOnce) {
  kiln::BackgroundCommit commit;
  Gate gate;
  commit.start([&] {
    gate.wait();
    throw std::runtime_error("cannot write checkpoint x.ckpt: write: No space left on device");
  });
  EXPECT_TRUE(commit.pending());
  EXPECT_FALSE(commit.poll().has_value()) << "a running write has no outcome yet";
  EXPECT_THROW(commit.start([] {}), std::logic_error) << "two commits in flight";
  gate.release();
  std::optional<std::string> failure;
  const auto until = Clock::now() + 60s;
  while (!failure && Clock::now() < until) {
    failure = commit.poll();
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(*failure, "cannot write checkpoint x.ckpt: write: No space left on device");
  EXPECT_FALSE(commit.pending());
  EXPECT_FALSE(commit.wait().has_value()) << "taken once";
}

TEST(BackgroundCommit, WaitBlocksUntilTheWriteEndsAndTheNextMayStart) {
  kiln::BackgroundCommit commit;
  std::atomic<int> written{0};
  Gate gate;
  commit.start([&] {
    gate.wait();
    written = 1;
  });
  std::thread releaser([&] {
    std::this_thread::sleep_for(20ms);
    gate.release();
  });
  EXPECT_FALSE(commit.wait().has_value());
  EXPECT_EQ(written.load(), 1) << "wait() returned before the write ended";
  releaser.join();
  commit.start([&] { written = 2; });
  EXPECT_FALSE(commit.wait().has_value());
  EXPECT_EQ(written.load(), 2);
}

TEST(BackgroundCommit, WhatTheWriteHeldIsFreedBeforeWaitReturns) {
  // The next snapshot is taken right after wait(): two state-sized copies
  // must never coexist.
  kiln::BackgroundCommit commit;
  for (int round = 0; round < 50; ++round) {
    auto held = std::make_shared<std::vector<char>>(1 << 16);
    std::weak_ptr<std::vector<char>> watch = held;
    commit.start([held = std::move(held)] { EXPECT_EQ(held->size(), 1u << 16); });
    EXPECT_FALSE(commit.wait().has_value());
    EXPECT_TRUE(watch.expired()) << "round " << round;
  }
}

TEST(BackgroundCommit, DestructionFinishesTheWriteInFlight) {
  std::atomic<bool> finished{false};
  {
    kiln::BackgroundCommit commit;
    commit.start([&] {
      std::this_thread::sleep_for(30ms);
      finished = true;
    });
  }
  EXPECT_TRUE(finished.load()) << "a snapshot being written is finished, not torn";
}

}  // namespace
