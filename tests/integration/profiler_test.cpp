// [profiler] (issue 23): a real two-process fit profiled — the trace of
// each rank parses as Chrome trace events with every phase, its events nest
// and never overlap within a track, the data workers have tracks of their
// own; the simple table's phases account for the fit's wall time.
#include <gtest/gtest.h>

#include <regex>

#include "integration/common.hpp"

namespace kiln::test {
namespace {

// The table's rows: phase -> total seconds and share (%), and its wall time.
struct Table {
  double wall = -1;
  std::map<std::string, double> total;
  std::map<std::string, double> share;
};
Table read_table(const std::string& output) {
  Table t;
  std::smatch m;
  if (std::regex_search(output, m, std::regex("profile of the fit[^:]*: ([0-9.]+) s wall"))) t.wall = std::stod(m[1]);
  const std::regex row("\\n  ([a-z_ ()-]+[a-z)]) +(?:[0-9]+ +)?(-?[0-9.]+) +(?:[0-9.]+ +)? *(-?[0-9.]+)%");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), row); it != std::sregex_iterator(); ++it) {
    t.total[(*it)[1]] = std::stod((*it)[2]);
    t.share[(*it)[1]] = std::stod((*it)[3]);
  }
  return t;
}

TEST(Profiler, TwoRanksTraceEveryPhaseNestedAndTheTableAddsUp) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  // A checkpoint each epoch, a worker thread for get_batch, validation.
  const auto m = synthetic_manifest(dir, "\n[profiler]\nkind = \"trace\"\n\n[checkpoint]\n");
  const auto started = std::chrono::steady_clock::now();
  const ProcessResult r =
      kiln_fit(m, {"-n", "2", "--set", "trainer.data_workers=1", "--set", "trainer.log_every_n_steps=5"});
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const Table table = read_table(r.output);
  ASSERT_GT(table.wall, 0) << r.output;
  EXPECT_LT(table.wall, elapsed) << "the fit is part of the process's life";
  EXPECT_NE(r.output.find("the slowest of 2"), std::string::npos) << r.output;
  double phases = 0, phase_seconds = 0;
  for (const char* phase : {"get_batch wait", "training_step", "backward", "gradient all-reduce wait",
                            "optimizer step", "validation", "callbacks", "checkpoint commit", "logging"}) {
    ASSERT_TRUE(table.share.count(phase)) << phase << "\n" << r.output;
    phases += table.share.at(phase);
    phase_seconds += table.total.at(phase);
  }
  EXPECT_NEAR(phases, 100.0, 5.0) << "the phases account for the fit's wall time\n" << r.output;
  ASSERT_TRUE(table.share.count("other (the loop itself)")) << r.output;
  // Each printed figure is rounded on its own (shares to 0.1 %, seconds to
  // 1 ms), so the ten rows can miss the whole by up to ten half-units: the
  // bound is that, and nothing looser.
  const double rows = 10;
  EXPECT_NEAR(phases + table.share.at("other (the loop itself)"), 100.0, rows * 0.05 + 1e-9) << r.output;
  EXPECT_NEAR(phase_seconds + table.total.at("other (the loop itself)"), table.wall, (rows + 1) * 0.0005 + 1e-9)
      << r.output;

  write_file(dir / "check.py", R"(import json, sys
phases = {"get_batch wait", "training_step", "backward", "gradient all-reduce wait", "optimizer step",
          "validation", "callbacks", "checkpoint commit", "logging", "fit"}
for path in sys.argv[1:]:
    trace = json.load(open(path))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in events}
    assert phases <= names, (path, phases - names)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "main" in threads and any(t.startswith("data worker") for t in threads), threads
    workers = [e for e in events if e["tid"] != 0]
    assert workers and all(e["name"] == "get_batch" for e in workers), path
    tracks = {}
    for e in events:
        assert e["dur"] >= 0 and e["ts"] >= 0, e
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    eps = 0.002  # microseconds: the file's resolution
    for track, evs in tracks.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ = []
        for e in evs:
            while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= e["ts"] + eps:
                open_.pop()
            if open_:
                parent = open_[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + eps, ("overlap", track, parent, e)
            open_.append(e)
    print(path, len(events), "events,", len(tracks), "tracks")
)");
  const ProcessResult check = run_process({check_python().string(), (dir / "check.py").string(),
                                           (dir / "run" / "trace.rank0.json").string(),
                                           (dir / "run" / "trace.rank1.json").string()});
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

// distributed.shard = "parameters": the operators' waits for gathers are a
// phase of their own, taken from the phases they happen in (forward's,
// backward's, validation's), and the table still adds up.
TEST(Profiler, ShardedParametersWaitsForGathersAreAPhaseOfTheirOwn) {
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[profiler]\nkind = \"simple\"\n");
  const ProcessResult r = kiln_fit(m, {"-n", "2", "--set", "trainer.max_epochs=1", "--set",
                                       "distributed.shard=\"parameters\"", "--set", "distributed.bucket_mb=0.0001"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Table table = read_table(r.output);
  // A row is printed for a phase that happened (its count above 0); its
  // seconds may round to 0.000 on a run this short.
  ASSERT_TRUE(table.share.count("parameter gather wait")) << r.output;
  double phases = 0;
  for (const auto& [phase, share] : table.share) phases += share;
  EXPECT_NEAR(phases, 100.0, static_cast<double>(table.share.size()) * 0.05 + 1e-9) << r.output;
}

// A fit that fails (here a callback's hook in epoch 1) still leaves each
// rank's trace up to the failure: what one opens to see what it was doing.
TEST(Profiler, AFailedFitLeavesItsTraceUpToTheFailure) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto m = recorder_manifest(dir, "", "size = 32", "fail_at = [\"on_train_epoch_end\"]",
                                   "max_epochs = 3\nbatch_size = 4\n\n[profiler]\nkind = \"trace\"\n");
  const ProcessResult r = kiln_fit(m);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("injected failure in on_train_epoch_end"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("profiler: the fit failed; rank 0's trace up to the failure is " +
                          (dir / "run" / "trace.rank0.json").string()),
            std::string::npos)
      << r.output;
  write_file(dir / "check.py", R"(import json, sys
trace = json.load(open(sys.argv[1]))
names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
assert {"fit", "training_step", "backward", "optimizer step", "callbacks"} <= names, names
print("ok", len(names))
)");
  const ProcessResult check = run_process(
      {check_python().string(), (dir / "check.py").string(), (dir / "run" / "trace.rank0.json").string()});
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

TEST(Profiler, SimpleWritesNoTraceAndOffSaysNothing) {
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[profiler]\nkind = \"simple\"\n");
  const ProcessResult r = kiln_fit(m, {"--set", "trainer.max_epochs=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Table table = read_table(r.output);
  EXPECT_GT(table.wall, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "trace.rank0.json"));
  // Another command is not profiled, and says so rather than print nothing.
  const ProcessResult validate = kiln({"validate", m.string()}, {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(validate.exit_code, 0) << validate.output;
  EXPECT_NE(validate.output.find("[profiler] kind = 'simple' profiles `kiln fit` only; this `kiln validate` is not "
                                 "profiled"),
            std::string::npos)
      << validate.output;
  const ProcessResult off = kiln_fit(m, {"--set", "trainer.max_epochs=1", "--set", "profiler.kind=none"});
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(off.output.find("profile of the fit"), std::string::npos) << off.output;
}

}  // namespace
}  // namespace kiln::test
