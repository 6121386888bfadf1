// [logging]: kiln's CSV, JSON Lines and TensorBoard files from real `kiln
// fit` runs. The event file is read by TensorBoard's own reader (the checking
// Python's EventAccumulator), and each scalar must be where metrics.csv and
// metrics.jsonl put it; a run killed after a checkpoint and resumed shows
// every step exactly once in every file; with two processes only rank 0
// writes. TensorBoard's HPARAMS tab, read by its own hparams plugin backend,
// shows each run's manifest and final metrics.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common.hpp"
#include "logged_files.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

TEST(Logging, TensorBoardsReaderFindsEveryScalarWhereMetricsCsvAndJsonlPutIt) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  // 3 epochs of 32 steps, a per-step cosine schedule: the rate changes every step.
  const auto m = synthetic_manifest(dir, std::string("\n[scheduler]\nname = \"cosine\"\ninterval = \"step\"\n") + kAllLoggers);
  const ProcessResult r = kiln_fit(m, {"--set", "trainer.log_every_n_steps=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto csv = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u);  // metrics.csv keeps its epoch rows only
  const auto scalars = by_tag_and_step(tensorboard_scalars(dir.path()));
  std::set<std::string> epoch_tags;
  for (const auto& row : csv) {
    const int64_t step = static_cast<int64_t>(row.at("step"));
    for (const auto& [column, value] : row) {
      if (column == "step") continue;
      epoch_tags.insert(column);
      const auto it = scalars.find({column, step});
      ASSERT_NE(it, scalars.end()) << column << " at step " << step << " is missing from the event file";
      expect_float_equal(it->second, value, column + " at step " + std::to_string(step));
    }
    // The monitors are metrics like any other.
    EXPECT_GT(row.at("train/samples_per_sec"), 0) << step;
    EXPECT_GT(row.at("train/step_time"), 0) << step;
    // The rate the epoch's last step used: cosine over 96 steps, period step - 1.
    EXPECT_NEAR(row.at("lr-Adam"), 0.01 * (1 + std::cos(M_PI * (step - 1) / 96.0)) / 2, 1e-9) << step;
  }
  EXPECT_TRUE(epoch_tags.count("lr-Adam") && epoch_tags.count("val/loss") && epoch_tags.count("epoch"));

  // metrics.jsonl: the same epoch rows, and a step row every 5 steps.
  const auto jsonl = read_jsonl(dir / "run" / "metrics.jsonl");
  std::vector<int64_t> step_rows;
  size_t epoch_row = 0;
  for (const auto& row : jsonl) {
    const int64_t step = std::stoll(row.at("step"));
    if (row.at("kind") == "epoch") {
      ASSERT_LT(epoch_row, csv.size());
      // Both files write the shortest text of the same double: equal, not near.
      for (const auto& [column, value] : csv[epoch_row]) EXPECT_EQ(std::stod(row.at(column)), value) << column;
      EXPECT_EQ(row.size(), csv[epoch_row].size() + 1) << "kind, epoch, step and the same metrics";
      ++epoch_row;
      continue;
    }
    ASSERT_EQ(row.at("kind"), "step");
    step_rows.push_back(step);
    EXPECT_EQ(std::stoll(row.at("epoch")), (step - 1) / 32);
    for (const char* tag : {"train/loss_step", "lr-Adam_step", "train/samples_per_sec_step", "train/step_time_step"}) {
      ASSERT_TRUE(row.count(tag)) << tag << " at step " << step;
      const auto it = scalars.find({tag, step});
      ASSERT_NE(it, scalars.end()) << tag << " at step " << step << " is missing from the event file";
      expect_float_equal(it->second, std::stod(row.at(tag)), std::string(tag) + " at step " + std::to_string(step));
    }
    EXPECT_NEAR(std::stod(row.at("lr-Adam_step")), 0.01 * (1 + std::cos(M_PI * (step - 1) / 96.0)) / 2, 1e-12);
  }
  EXPECT_EQ(epoch_row, csv.size());
  std::vector<int64_t> expected;
  for (int64_t s = 5; s <= 96; s += 5) expected.push_back(s);
  EXPECT_EQ(step_rows, expected);
  // Nothing in the event file that the text files do not have.
  EXPECT_EQ(scalars.size(), csv.size() * epoch_tags.size() + expected.size() * 4);
}

// TensorBoard's HPARAMS tab over a log directory, as `tensorboard --logdir`
// serves it, offline: the hparams plugin's own backend (backend_context,
// get_experiment, list_session_groups) on TensorBoard's event multiplexer.
struct HParamsTab {
  std::map<std::string, std::string> column_hparams;   // name -> "DATA_TYPE_... differs"
  std::set<std::string> column_metrics;                 // tags
  std::map<std::string, std::string> status;            // session (run) -> STATUS_...
  std::map<std::pair<std::string, std::string>, std::string> hparams;  // (session, name) -> "kind json"
  std::map<std::pair<std::string, std::string>, double> metrics;      // (session, tag) -> last value
  std::set<std::string> start_infos;                // sessions whose start info parses (with hparams and a time)
  std::map<std::string, std::string> end_infos;     // session -> the status its end info holds
  std::string output;

  std::string hparam(const std::string& session, const std::string& name) const {
    const auto it = hparams.find({session, name});
    return it == hparams.end() ? "(missing)" : it->second;
  }
  std::string column(const std::string& name) const {
    const auto it = column_hparams.find(name);
    return it == column_hparams.end() ? "(missing)" : it->second;
  }
};

// How many times `needle` is in the file's bytes.
int occurrences(const std::filesystem::path& file, const std::string& needle) {
  const std::string bytes = read_file(file);
  int n = 0;
  for (size_t at = bytes.find(needle); at != std::string::npos; at = bytes.find(needle, at + 1)) ++n;
  return n;
}

HParamsTab hparams_tab(const std::filesystem::path& logdir) {
  const auto script = logdir / "read_hparams.py";
  write_file(script, R"PY(# TensorBoard's HPARAMS tab, offline: its hparams plugin's backend over the
# event files under a log directory, as `tensorboard --logdir` serves it.
import json, sys
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups, metadata

logdir = sys.argv[1]
mux = plugin_event_multiplexer.EventMultiplexer()
mux.AddRunsFromDirectory(logdir)
mux.Reload()
tb = base_plugin.TBContext(logdir=logdir, multiplexer=mux,
                           data_provider=data_provider.MultiplexerDataProvider(mux, logdir))
backend = backend_context.Context(tb)
ctx = context.RequestContext()

# The session start info as TensorBoard's metadata module parses it.
for run, tags in mux.PluginRunToTagToContent(metadata.PLUGIN_NAME).items():
    for tag, content in tags.items():
        if tag == metadata.SESSION_START_INFO_TAG:
            info = metadata.parse_session_start_info_plugin_data(content)
            print("start_info", run, info.start_time_secs > 0, len(info.hparams))
        elif tag == metadata.SESSION_END_INFO_TAG:
            info = metadata.parse_session_end_info_plugin_data(content)
            print("end_info", run, api_pb2.Status.Name(info.status), info.end_time_secs > 0)

experiment = get_experiment.Handler(ctx, backend, "", api_pb2.GetExperimentRequest()).run()
for h in experiment.hparam_infos:
    print("column_hparam", h.name, api_pb2.DataType.Name(h.type), h.differs)
for m in experiment.metric_infos:
    print("column_metric", m.name.tag, repr(m.name.group))

# As the tab asks: every status, the first page.
request = api_pb2.ListSessionGroupsRequest(
    start_index=0, slice_size=1000, allowed_statuses=list(api_pb2.Status.values()))
for group in list_session_groups.Handler(ctx, backend, "", request).run().session_groups:
    # kiln writes no group name: each run is its own group, named after it.
    (session,) = group.sessions
    print("session", session.name, api_pb2.Status.Name(session.status),
          0 < session.start_time_secs <= session.end_time_secs)
    for name, value in sorted(group.hparams.items()):
        kind = value.WhichOneof("kind")
        print("hparam", session.name, name, kind, json.dumps(getattr(value, kind)))
    for m in group.metric_values:
        print("metric", session.name, m.name.tag, repr(m.value), m.training_step)
)PY");
  const ProcessResult r =
      run_process({check_python().string(), script.string(), logdir.string()}, {.timeout = std::chrono::seconds(300)});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  HParamsTab tab;
  tab.output = r.output;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string kind, a, b, c, rest;
    words >> kind >> a;
    if (kind == "start_info") {
      words >> b >> c;
      if (b == "True" && std::stoi(c) > 0) tab.start_infos.insert(a);
    } else if (kind == "end_info") {
      words >> b;
      tab.end_infos[a] = b;
    } else if (kind == "column_hparam") {
      words >> b >> c;
      tab.column_hparams[a] = b + " " + c;
    } else if (kind == "column_metric") {
      tab.column_metrics.insert(a);
    } else if (kind == "session") {
      words >> b >> c;
      tab.status[a] = b;
      EXPECT_EQ(c, "True") << "start and end times of " << a;
    } else if (kind == "hparam") {
      words >> b >> c;
      std::getline(words, rest);
      tab.hparams[{a, b}] = c + rest;
    } else if (kind == "metric") {
      words >> b >> c;
      tab.metrics[{a, b}] = std::stod(c);
    }
  }
  return tab;
}

// A sweep of two runs in one log directory (runs/<name>), each with a --set
// learning rate: the HPARAMS tab has a session for each, holding the run's
// manifest flattened to dotted keys (host keys and the plugins' own), the
// --set value among them; it ended with STATUS_SUCCESS; its metrics are the
// logged scalars (kiln writes no experiment summary: TensorBoard computes the
// columns from the runs), each at its last value, metrics.csv's last row.
TEST(Logging, TensorBoardsHParamsTabShowsEachRunsManifestAndItsLastMetrics) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[logging]\nloggers = [\"csv\", \"tensorboard\"]\n");
  const auto runs = dir / "runs";
  for (const char* lr : {"0.003", "0.01"}) {
    const ProcessResult r = kiln_fit(m, {"--set", std::string("optimizer.lr=") + lr, "--set",
                                         "run.dir=" + (runs / ("lr_" + std::string(lr))).string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const HParamsTab tab = hparams_tab(runs);
  EXPECT_EQ(tab.status,
            (std::map<std::string, std::string>{{"lr_0.003", "STATUS_SUCCESS"}, {"lr_0.01", "STATUS_SUCCESS"}}))
      << tab.output;
  EXPECT_EQ(tab.start_infos, (std::set<std::string>{"lr_0.003", "lr_0.01"})) << tab.output;
  EXPECT_EQ(tab.end_infos, tab.status) << tab.output;
  for (const std::string session : {"lr_0.003", "lr_0.01"}) {
    EXPECT_EQ(occurrences(runs / session / "events.out.tfevents.kiln", "_hparams_/session_start_info"), 1);
    EXPECT_EQ(occurrences(runs / session / "events.out.tfevents.kiln", "_hparams_/session_end_info"), 1);
    auto hparam = [&](const std::string& name) { return tab.hparam(session, name); };
    EXPECT_EQ(hparam("optimizer.lr"), "number_value " + session.substr(3)) << tab.output;
    EXPECT_EQ(hparam("optimizer.name"), "string_value \"adam\"");
    EXPECT_EQ(hparam("trainer.max_epochs"), "number_value 3.0");
    EXPECT_EQ(hparam("model.path"), "string_value \"kiln_mlp\"");  // the plugins' tables
    EXPECT_EQ(hparam("model.hidden"), "string_value \"[32]\"");    // an array: its TOML text
    EXPECT_EQ(hparam("data.features"), "number_value 32.0");
    EXPECT_EQ(hparam("trainer.batch_size"), "number_value 32.0");
    EXPECT_EQ(hparam("logging.loggers"), "string_value \"[\\\"csv\\\", \\\"tensorboard\\\"]\"");
    EXPECT_EQ(hparam("trainer.shuffle"), "(missing)");  // a default the manifest does not write
    // The final metrics: each tag's last value, metrics.csv's last row.
    const auto csv = read_metrics(runs / session / "metrics.csv");
    ASSERT_EQ(csv.size(), 3u);
    for (const char* tag : {"val/loss", "val/acc", "train/loss", "lr-Adam"}) {
      const auto it = tab.metrics.find({session, tag});
      ASSERT_NE(it, tab.metrics.end()) << session << " " << tag << "\n" << tab.output;
      expect_float_equal(it->second, csv.back().at(tag), session + " " + tag);
    }
  }
  // The columns: the hparams with their types (the one that differs says
  // so), and the epoch rows' metrics.
  EXPECT_EQ(tab.column("optimizer.lr"), "DATA_TYPE_FLOAT64 True") << tab.output;
  EXPECT_EQ(tab.column("run.dir"), "DATA_TYPE_STRING True");
  EXPECT_EQ(tab.column("model.path"), "DATA_TYPE_STRING False");
  EXPECT_EQ(tab.column("data.features"), "DATA_TYPE_FLOAT64 False");
  for (const char* tag : {"val/loss", "val/acc", "train/loss", "epoch"})
    EXPECT_TRUE(tab.column_metrics.count(tag)) << tag << "\n" << tab.output;
}

// A run that fails after logging rows (a callback throws in on_fit_end)
// ends its session with STATUS_FAILURE.
TEST(Logging, AFailedRunsHParamsSessionEndsWithStatusFailure) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto m = recorder_manifest(dir, "features = 4", "size = 16\nfeatures = 4", "fail_at = [\"on_fit_end\"]",
                                   "max_epochs = 2\nbatch_size = 4\n[logging]\nloggers = [\"tensorboard\"]\n");
  const ProcessResult r = kiln_fit(m);
  ASSERT_NE(r.exit_code, 0) << r.output;
  ASSERT_NE(read_file(dir / "calls.log").find("on_fit_end"), std::string::npos) << r.output;
  const HParamsTab tab = hparams_tab(dir.path());
  EXPECT_EQ(tab.status, (std::map<std::string, std::string>{{"run", "STATUS_FAILURE"}})) << tab.output;
  EXPECT_EQ(tab.end_infos, tab.status);
  EXPECT_EQ(tab.hparam("run", "callbacks.0.fail_at"), "string_value \"[\\\"on_fit_end\\\"]\"") << tab.output;
  EXPECT_EQ(tab.hparam("run", "trainer.max_epochs"), "number_value 2.0");
}

// The recorder's model hangs in its 18th training step (after 17 steps);
// checkpoints every 5 steps, so the last is at step 15, and the step row and
// the epoch row at step 16 were logged after it. The resumed run repeats
// step 16: every file must show it once.
std::filesystem::path hanging_manifest(const TempDir& dir, const std::string& model_extra, int processes = 1) {
  const std::string data = "size = " + std::to_string(32 * processes) + "\nfeatures = 4";
  return recorder_manifest(dir, "features = 4\n" + model_extra, data, "",
                           "max_epochs = 3\nbatch_size = 4\nlog_every_n_steps = 2\n[optimizer]\nname = \"sgd\"\nlr = 0.1\n"
                           "[checkpoint]\nevery_n_steps = 5\nevery_n_epochs = 0\nsave_top_k = 1\n" +
                               std::string(kAllLoggers));
}

TEST(Logging, AResumedRunContinuesEveryFileWithEachStepOnce) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir straight, killed;
  const ProcessResult s = kiln_fit(hanging_manifest(straight, ""));
  ASSERT_EQ(s.exit_code, 0) << s.output;

  const auto m = hanging_manifest(killed, "hang_on_rank = 0\nhang_after = 17");
  {
    BackgroundRun run(killed, [&] { return kiln_fit(m); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(120 * timeout_scale());
    // Hung, and step 15's checkpoint durable: commits are asynchronous, so
    // the write may still be under way when the step hangs.
    const auto step_15 = killed / "run" / "checkpoints" / "epoch=0001-step=000000015.ckpt";
    while ((read_file(killed / "calls.log").find("model:training_step hangs") == std::string::npos ||
            !std::filesystem::exists(step_15)) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_NE(read_file(killed / "calls.log").find("model:training_step hangs"), std::string::npos);
    ASSERT_TRUE(std::filesystem::exists(step_15));
    for (pid_t p : processes_mentioning(killed.path().string())) ::kill(p, SIGKILL);
    EXPECT_EQ(run.result().signal, SIGKILL) << run.result().output;
  }
  // Rows the checkpoint (step 15) never saw are in the files now.
  const auto before = jsonl_rows(killed / "run" / "metrics.jsonl");
  EXPECT_EQ(before.back(), "epoch 16");
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last", "--set", "model.hang_on_rank=-1"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step 15"), std::string::npos) << resumed.output;

  // The same rows as the run that was never interrupted, each once.
  const auto rows = jsonl_rows(killed / "run" / "metrics.jsonl");
  EXPECT_EQ(rows, jsonl_rows(straight / "run" / "metrics.jsonl"));
  EXPECT_EQ(std::set<std::string>(rows.begin(), rows.end()).size(), rows.size());
  const auto csv = read_metrics(killed / "run" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[1].at("step"), 16);
  // TensorBoard: each (tag, step) once, the same ones as the straight run, and
  // the deterministic values equal (the loss of each logged step).
  expect_the_same_scalars(straight.path(), killed.path(), [](const std::string& tag) {
    return tag == "train/loss_step" || tag == "train/loss" || tag == "lr-SGD";
  });
  // The hyperparameters once, the first run's (its model.hang_after, not the
  // resumed run's --set), and the end the resumed run wrote.
  const auto events = killed / "run" / "events.out.tfevents.kiln";
  EXPECT_EQ(occurrences(events, "_hparams_/session_start_info"), 1);
  EXPECT_EQ(occurrences(events, "_hparams_/session_end_info"), 1);
  const HParamsTab tab = hparams_tab(killed.path());
  EXPECT_EQ(tab.status, (std::map<std::string, std::string>{{"run", "STATUS_SUCCESS"}})) << tab.output;
  EXPECT_EQ(tab.hparam("run", "model.hang_on_rank"), "number_value 0.0") << tab.output;
}

// An epoch a stop cut short (max_steps here) still logs its row, marked: a
// `partial` column in metrics.csv (1 there, absent elsewhere) and
// "partial":true in metrics.jsonl. The resume that finishes the epoch
// replaces the row: the files end as an uninterrupted run's, unmarked.
TEST(Logging, APartialEpochRowIsMarkedAndAResumeReplacesIt) {
  const auto manifest = [](const TempDir& dir) {
    return write_run_manifest(dir, RunManifest{.data = synthetic_keys(32, 4, "train_size = 256\nval_size = 64\n"),
                                               .trainer = trainer_keys(2, 32, "log_every_n_steps = 2\n"),
                                               .extra = "\n[checkpoint]\nevery_n_epochs = 1\n"
                                                        "\n[logging]\nloggers = [\"csv\", \"jsonl\"]\n"});
  };
  TempDir straight, stopped;
  ProcessResult r = kiln_fit(manifest(straight));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = kiln_fit(manifest(stopped), {"--set", "trainer.max_steps=12"});  // 8 steps an epoch: 4 of epoch 1
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto cut = read_metrics(stopped / "run" / "metrics.csv");
  ASSERT_EQ(cut.size(), 2u) << read_file(stopped / "run" / "metrics.csv");
  EXPECT_EQ(cut[0].count("partial"), 0u) << "a whole epoch's row is not marked";
  ASSERT_EQ(cut[1].count("partial"), 1u) << read_file(stopped / "run" / "metrics.csv");
  EXPECT_EQ(cut[1].at("partial"), 1);
  EXPECT_EQ(cut[1].at("step"), 12);
  std::vector<std::string> marked;
  for (const auto& row : read_jsonl(stopped / "run" / "metrics.jsonl"))
    if (row.count("partial")) marked.push_back(row.at("kind") + " " + row.at("step") + " " + row.at("partial"));
  EXPECT_EQ(marked, std::vector<std::string>{"epoch 12 true"});

  r = kiln_fit(manifest(stopped), {"--resume", "last"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(rows_without_timings(stopped / "run" / "metrics.csv"),
            rows_without_timings(straight / "run" / "metrics.csv"));
  EXPECT_EQ(read_file(stopped / "run" / "metrics.csv").find("partial"), std::string::npos);
  EXPECT_EQ(jsonl_rows(stopped / "run" / "metrics.jsonl"), jsonl_rows(straight / "run" / "metrics.jsonl"));
  EXPECT_EQ(read_file(stopped / "run" / "metrics.jsonl").find("partial"), std::string::npos);
}

TEST(Logging, WithTwoProcessesOnlyRankZeroWrites) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  // 64 samples over 2 ranks, 4 a batch: 8 steps an epoch, 24 in all.
  const ProcessResult r = kiln({"fit", hanging_manifest(dir, "", 2).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> expected;
  for (int64_t step = 2; step <= 24; step += 2) {
    expected.push_back("step " + std::to_string(step));
    if (step % 8 == 0) expected.push_back("epoch " + std::to_string(step));
  }
  EXPECT_EQ(jsonl_rows(dir / "run" / "metrics.jsonl"), expected);
  const auto scalars = by_tag_and_step(tensorboard_scalars(dir.path()));
  EXPECT_EQ(scalars.count({"train/loss_step", 24}), 1u);
  // Throughput counts both ranks' samples: 8 a step.
  const auto csv = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u);
  for (const auto& row : csv) EXPECT_GT(row.at("train/samples_per_sec"), 0);
}

TEST(Logging, TheDefaultIsMetricsCsvAloneAndAnEmptyListWritesNoMetricsFile) {
  TempDir plain, none;
  ASSERT_EQ(kiln_fit(synthetic_manifest(plain)).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(plain / "run" / "metrics.csv"));
  EXPECT_FALSE(std::filesystem::exists(plain / "run" / "metrics.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(plain / "run" / "events.out.tfevents.kiln"));
  const auto rows = read_metrics(plain / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].at("lr-Adam"), 0.01);
  ASSERT_EQ(kiln_fit(synthetic_manifest(none, "\n[logging]\nloggers = []\n")).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(none / "run" / "metrics.csv"));
  EXPECT_FALSE(std::filesystem::exists(none / "run" / "metrics.jsonl"));
}

}  // namespace
}  // namespace kiln::test
