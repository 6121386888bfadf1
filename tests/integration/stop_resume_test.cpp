// Every way a fit can stop inside an epoch and be continued, against the run
// that was never stopped (docs/checkpoints.md, "every stop resumes exactly"):
// max_steps (then a larger max_steps, then none), max_time, early stopping
// at a validation inside an epoch, a preemption (SIGTERM), Ctrl-C (SIGINT)
// with checkpoints on a schedule, a crash, each continued with `--resume
// last` and, in a copy of the run directory, with `--resume auto`, and a
// crash healed by `--max-restarts`; with 1 and 2 processes. Each final run
// directory must hold the uninterrupted run's metrics.csv, metrics.jsonl and
// TensorBoard scalars and its weights and optimizer state, to the bit, with
// no row twice.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <tuple>

#include "checkpoint_sections.hpp"
#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "common.hpp"
#include "logged_files.hpp"

namespace kiln::test {
namespace {

constexpr int64_t kStepsPerEpoch = 24;
constexpr int64_t kEpochs = 2;

// The shipped MLP on synthetic data: 24 optimizer steps an epoch with any
// number of processes, four validations an epoch (three inside it), a step
// row every 4 steps, every logger; the recorder callback (callbacks[0]) can
// signal, crash or slow the run at a step, and early stopping
// (callbacks[1]) watches val/loss for a rise it never sees (mode "max",
// patience 1000) unless a case lowers its patience.
void write_manifest(const std::filesystem::path& dir, int processes) {
  const std::string recorder = (test_plugin_dir() / "libkiln_test_recorder.so").string();
  write_run_manifest(
      dir, {.name = "stops",
            .run_dir = "run",
            .run = "seed = 7\nthreads = 1\n",
            .model = mlp_keys(16, "[16]", 3),
            .data = synthetic_keys(16, 3, "train_size = " + std::to_string(kStepsPerEpoch * 8 * processes) +
                                              "\nval_size = 48\ntest_size = 0\n"),
            .trainer = trainer_keys(kEpochs, 8, "val_check_interval = 0.25\nlog_every_n_steps = 4\ndata_workers = 0\n"),
            .extra = "\n[[callbacks]]\npath = \"" + recorder + "\"\nid = \"test.recorder_callback\"\n\n"
                     "[[callbacks]]\npath = \"kiln_early_stopping\"\nmonitor = \"val/loss\"\nmode = \"max\"\n"
                     "patience = 1000\n\n[checkpoint]\n\n[logging]\nloggers = [\"csv\", \"jsonl\", \"tensorboard\"]\n"});
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ProcessResult fit(const std::filesystem::path& dir, const std::vector<std::string>& args) {
  return kiln_fit(dir / "run.toml", args);
}

// What a stopped run left, read the way people read it.
struct Logged {
  std::vector<std::map<std::string, double>> csv;
  std::vector<std::map<std::string, std::string>> jsonl;
  std::map<std::pair<std::string, int64_t>, double> scalars;
  std::map<std::string, std::string> weights;  // the last checkpoint's parameters, buffers, optimizer state
};

// The columns that measure time, in epoch rows and (with "_step") step rows.
bool is_timing(std::string name) {
  if (name.size() > 5 && name.compare(name.size() - 5, 5, "_step") == 0) name.resize(name.size() - 5);
  return name == "epoch_seconds" || name == "train/samples_per_sec" || name == "train/step_time";
}

Logged read_logged(const std::filesystem::path& dir) {
  Logged out;
  out.csv = read_metrics(dir / "run" / "metrics.csv");
  for (auto& row : out.csv) erase_timings(row);
  out.jsonl = read_jsonl(dir / "run" / "metrics.jsonl");
  for (auto& row : out.jsonl)
    for (auto it = row.begin(); it != row.end();) it = is_timing(it->first) ? row.erase(it) : std::next(it);
  out.scalars = by_tag_and_step(tensorboard_scalars(dir));
  const auto last = dir / "run" / "checkpoints" / "last.ckpt";
  for (const char* prefix : {"param/", "buffer/", "optim/"}) out.weights.merge(sections(last, prefix));
  return out;
}

// `got` is `want` to the bit, and no logger holds a row twice.
void expect_the_uninterrupted_run(const Logged& want, const Logged& got) {
  std::set<std::pair<double, double>> epoch_steps;
  for (const auto& row : got.csv)
    EXPECT_TRUE(epoch_steps.emplace(row.at("epoch"), row.at("step")).second)
        << "metrics.csv holds (epoch " << row.at("epoch") << ", step " << row.at("step") << ") twice";
  EXPECT_EQ(got.csv, want.csv) << "metrics.csv";
  std::set<std::tuple<std::string, std::string, std::string>> rows;
  for (const auto& row : got.jsonl)
    EXPECT_TRUE(rows.emplace(row.at("kind"), row.at("epoch"), row.at("step")).second)
        << "metrics.jsonl holds a " << row.at("kind") << " row at step " << row.at("step") << " twice";
  EXPECT_EQ(got.jsonl, want.jsonl) << "metrics.jsonl";
  // by_tag_and_step has checked that each (tag, step) is there once.
  ASSERT_EQ(got.scalars.size(), want.scalars.size()) << "TensorBoard scalars";
  for (const auto& [key, value] : want.scalars) {
    const auto it = got.scalars.find(key);
    ASSERT_NE(it, got.scalars.end()) << key.first << " at step " << key.second;
    if (!is_timing(key.first)) EXPECT_EQ(it->second, value) << key.first << " at step " << key.second;
  }
  ASSERT_FALSE(want.weights.empty());
  EXPECT_TRUE(got.weights == want.weights) << "the final weights or optimizer state differ";
}

struct StopCase {
  std::string name;
  std::vector<std::string> stop;                  // the flags of the run that stops
  int exit_code;                                  // what it exits with (-1: it dies or fails, any way)
  std::string says;                               // what its output names as the reason
  std::vector<std::vector<std::string>> resumes;  // each continuation's flags besides --resume
  bool inside_an_epoch;                           // the checkpoint it continues from is inside an epoch
};

std::vector<StopCase> stop_cases(const std::filesystem::path& dir, int processes) {
  // A preemption reaches every process (a scheduler signals each task);
  // Ctrl-C reaches kiln's launcher, which forwards it to the ranks, where
  // it lands at a vote the forwarding's timing decides.
  const std::string sigint_to = std::string("callbacks[0].signal_to=") + (processes > 1 ? "launcher" : "self");
  // Each crash case its own marker: rank 0 dies once per case.
  auto crash = [&](const std::string& marker) {
    return std::vector<std::string>{"--set", "checkpoint.every_n_steps=7", "--set", "callbacks[0].crash_at_step=17",
                                    "--set", "callbacks[0].crash_marker=" + (dir / marker).string()};
  };
  return {
      {"max_steps, then a larger max_steps, then none",
       {"--set", "trainer.max_steps=5"},
       0,
       "max_steps=5 reached",
       {{"--set", "trainer.max_steps=30"}, {}},
       true},
      // Wherever the clock runs out: 48 steps take 2.9 s at least.
      {"max_time",
       {"--set", "trainer.max_time=00:00:01", "--set", "callbacks[0].batch_end_ms=60"},
       0,
       "max_time=00:00:01 reached",
       {{}},
       false},
      // The second validation (epoch 0, batch 12) is lower: a bad check.
      {"early stopping at a validation inside an epoch",
       {"--set", "callbacks[1].patience=1"},
       0,
       "early stopping: 'val/loss' did not improve",
       {{}},
       true},
      {"SIGTERM (preemption)",
       {"--set", "callbacks[0].signal_at_step=10", "--set", "callbacks[0].signal=SIGTERM"},
       75,
       "preempted by SIGTERM",
       {{}},
       true},
      {"SIGINT, checkpoints every 7 steps",
       {"--set", "checkpoint.every_n_steps=7", "--set", "callbacks[0].signal_at_step=17", "--set",
        "callbacks[0].signal=SIGINT", "--set", sigint_to},
       130,
       "interrupted by SIGINT",
       {{}},
       processes == 1},
      // One process dies with no one to report it (the test sees the signal).
      {"a crash, checkpoints every 7 steps", crash("crashed"), -1, processes > 1 ? "killed by SIGKILL" : "", {{}},
       true},
      {"a crash healed by --max-restarts",
       concat({"-n", std::to_string(processes), "--max-restarts", "1"}, crash("crashed-healed")),
       0,
       "restart 1/1",
       {},
       true},
  };
}

class EveryStop : public testing::TestWithParam<int> {};

TEST_P(EveryStop, ResumesToTheUninterruptedRunsFilesAndWeights) {
  KILN_REQUIRE_CHECK_PYTHON();
  const int n = GetParam();
  TempDir straight;
  write_manifest(straight.path(), n);
  const ProcessResult s = fit(straight.path(), processes(n));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const Logged want = read_logged(straight.path());
  ASSERT_EQ(want.csv.size(), static_cast<size_t>(kEpochs * 4)) << "four validations an epoch";

  TempDir root;
  int index = 0;
  for (const StopCase& c : stop_cases(root.path(), n)) {
    SCOPED_TRACE(c.name);
    const auto dir = root / ("case" + std::to_string(index++));
    std::filesystem::create_directories(dir);
    write_manifest(dir, n);
    std::vector<std::string> stop_args = c.stop;
    // The healed crash names its own -n.
    if (stop_args.empty() || stop_args[0] != "-n") stop_args = concat(processes(n), stop_args);
    const ProcessResult stopped = fit(dir, stop_args);
    if (c.exit_code >= 0) {
      ASSERT_EQ(stopped.exit_code, c.exit_code) << stopped.output;
    } else {
      ASSERT_TRUE(stopped.exit_code != 0 || stopped.signal != 0) << stopped.output;
      if (n == 1) EXPECT_EQ(stopped.signal, SIGKILL) << stopped.output;
    }
    EXPECT_NE(stopped.output.find(c.says), std::string::npos) << stopped.output;
    if (c.resumes.empty()) {
      expect_the_uninterrupted_run(want, read_logged(dir));
      continue;
    }
    // The case is the one it claims: the fit stopped before its end, and
    // where it can be made to, inside an epoch.
    const CheckpointMeta meta = read_meta(CheckpointFile::read(dir / "run" / "checkpoints" / "last.ckpt"));
    EXPECT_LT(meta.position.global_step, kEpochs * kStepsPerEpoch);
    if (c.inside_an_epoch) {
      EXPECT_GT(meta.position.next_batch, 0) << stopped.output;
      EXPECT_LT(meta.position.next_batch, kStepsPerEpoch) << stopped.output;
    }
    const auto copy = root / ("case" + std::to_string(index++) + "-auto");
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    for (const auto& [where, mode] : {std::pair{dir, "last"}, std::pair{copy, "auto"}}) {
      SCOPED_TRACE(std::string("--resume ") + mode);
      for (const auto& flags : c.resumes) {
        const ProcessResult resumed = fit(where, concat(concat(processes(n), {"--resume", mode}), flags));
        ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
        if (std::string(mode) == "auto")
          EXPECT_NE(resumed.output.find("--resume auto: resuming from"), std::string::npos) << resumed.output;
      }
      expect_the_uninterrupted_run(want, read_logged(where));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Resume, EveryStop, testing::Values(1, 2),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + (info.param == 1 ? "Process" : "Processes");
                         });

// A checkpoint written by the kiln before checkpoint parts were registered
// (main of 2026-11-28, ABI 1.5: metrics.csv's text in "metrics/csv", the
// other loggers' states as lines of "metrics/loggers"; today each logger's
// is "logger/<name>"), saved by `--set trainer.max_steps=6` inside epoch 1
// of tests/data/checkpoint_before_parts/run.toml, with the run directory it
// left. Resumed by today's kiln, it ends where the same checkpoint in
// today's layout ends (its sections renamed, nothing else changed), to the
// bit: the weights, the optimizer state and every logger's file. (Against
// a run of today's kiln from the start it could not be compared bitwise:
// the fixture's first steps ran on another machine's BLAS.)
TEST(Resume, ACheckpointOfTheKilnBeforeRegisteredPartsContinuesExactly) {
  const std::filesystem::path fixture = source_dir() / "tests" / "data" / "checkpoint_before_parts";
  auto run_dir_of = [&](const TempDir& dir) {
    std::filesystem::copy(fixture / "run", dir / "run", std::filesystem::copy_options::recursive);
    std::string text = read_file(fixture / "run.toml");
    const std::string relative = "dir = \"run\"";
    text.replace(text.find(relative), relative.size(), "dir = \"" + (dir / "run").string() + "\"");
    write_file(dir / "run.toml", text);
    return dir / "run" / "checkpoints" / "last.ckpt";
  };
  TempDir older, today;
  const auto older_checkpoint = run_dir_of(older), today_checkpoint = run_dir_of(today);
  {
    const CheckpointFile file = CheckpointFile::read(today_checkpoint);
    ASSERT_TRUE(file.has("metrics/csv") && file.has("metrics/loggers")) << "the fixture is an older kiln's";
    CheckpointSnapshot renamed;
    for (const auto& name : file.names())
      if (name != "metrics/csv" && name != "metrics/loggers") renamed.add(name, std::string(file.section(name)));
    renamed.add("logger/csv", std::string(file.section("metrics/csv")));
    std::istringstream lines{std::string(file.section("metrics/loggers"))};
    for (std::string line; std::getline(lines, line);)
      renamed.add("logger/" + line.substr(0, line.find(' ')), line.substr(line.find(' ') + 1));
    std::filesystem::remove(today_checkpoint);
    commit_checkpoint(today_checkpoint, renamed);
  }
  for (const auto& [dir, checkpoint] : {std::pair{&older, older_checkpoint}, std::pair{&today, today_checkpoint}}) {
    const ProcessResult r = kiln_fit(*dir / "run.toml", {"--resume", checkpoint.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("epoch 1, batch 2, step 6"), std::string::npos) << r.output;
  }
  const Logged want = read_logged(today.path()), got = read_logged(older.path());
  ASSERT_EQ(want.csv.size(), 3u) << "metrics.csv: one row an epoch, the first from before the checkpoint";
  expect_the_uninterrupted_run(want, got);
}

}  // namespace
}  // namespace kiln::test
