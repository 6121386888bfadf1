// The host's batch probe (ABI 1.5's check_batch) leaves no trace: for every
// shipped data module, a run whose model checks the first samples logs the
// same lines and the same metrics as the same run of a twin model that
// checks nothing (tests/CMakeLists.txt builds kiln_mlp, kiln_cnn and
// kiln_charlm again without check_batch). A data module that counted, logged
// or cached the probe's samples as an epoch's would differ (docs/abi.md,
// "for_check").
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr std::chrono::seconds kTimeout{600};

// The lines a data module logged (through the host: "[<id>] ..."), from
// the id on: timestamps left out.
std::vector<std::string> lines_of(const std::string& output, const std::string& id) {
  std::vector<std::string> out;
  std::istringstream in(output);
  const std::string tag = "[" + id + "] ";
  for (std::string line; std::getline(in, line);)
    if (const size_t at = line.find(tag); at != std::string::npos) out.push_back(line.substr(at));
  return out;
}

struct Probed {
  std::string data_id;                  // the data module's plugin id
  std::filesystem::path manifest, cwd;  // `kiln fit manifest` run in cwd
  std::string model;                    // the model's shipped name: "mlp", "cnn", "charlm"
  std::vector<std::string> sets;        // --set overrides, beside run.dir and model.path
  std::vector<std::string> expected;    // lines the data module must log (a check that the case bites)
};

// Runs `c` with the shipped model and with its unchecked twin; both runs'
// data module lines and metrics must be the same.
void expect_no_trace(const Probed& c) {
  SCOPED_TRACE(c.data_id);
  std::vector<std::string> logged[2];
  std::vector<std::map<std::string, double>> rows[2];
  for (int twin = 0; twin < 2; ++twin) {
    TempDir run;
    std::vector<std::string> args{"fit", c.manifest.string(), "--set", "run.dir=" + (run / "run").string(),
                                  "--set", "trainer.progress=none", "--set", "checkpoint.save_top_k=0"};
    if (twin)
      args.insert(args.end(), {"--set", "model.path=" + (test_plugin_dir() / ("libkiln_test_" + c.model +
                                                                              "_unchecked.so")).string()});
    for (const std::string& s : c.sets) args.insert(args.end(), {"--set", s});
    const ProcessResult r = kiln(args, {.cwd = c.cwd, .timeout = kTimeout});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    logged[twin] = lines_of(r.output, c.data_id);
    rows[twin] = rows_without_timings(run / "run" / "metrics.csv");
    ASSERT_FALSE(rows[twin].empty()) << r.output;
    for (const std::string& line : c.expected)
      EXPECT_NE(std::find(logged[twin].begin(), logged[twin].end(), line), logged[twin].end())
          << (twin ? "twin" : "probed") << " run lacks: " << line << "\n" << r.output;
  }
  EXPECT_EQ(logged[0], logged[1]) << "the probe left lines of its own";
  EXPECT_EQ(rows[0], rows[1]) << "the probe changed the metrics";
}

TEST(BatchCheck, TheProbeLeavesNoTraceInAnyShippedDataModule) {
  if (!std::filesystem::exists(test_plugin_dir() / "libkiln_test_mlp_unchecked.so"))
    GTEST_SKIP() << "the unchecked twins are built in Debian's variant only (KILN_TEST_TWINS)";
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const ProcessResult made = run_process({check_python().string(),
                                          (source_dir() / "examples" / "own_data" / "make_data.py").string(),
                                          (dir / "data").string()},
                                         {.timeout = kTimeout});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto own = [](const char* name) { return source_dir() / "examples" / "own_data" / name; };
  const std::vector<std::string> short_run{"trainer.max_epochs=2", "trainer.limit_train_batches=3",
                                           "trainer.test_after_fit=true"};

  // kiln_image_folder counts and names what skip_unreadable replaces, per
  // epoch: the train split's first image (sample 0 without a held-out
  // part, what the probe reads first) unreadable.
  const auto train = dir / "data" / "images" / "train";
  std::vector<std::filesystem::path> classes;
  for (const auto& e : std::filesystem::directory_iterator(train)) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  ASSERT_FALSE(classes.empty());
  std::vector<std::filesystem::path> images;
  for (const auto& e : std::filesystem::directory_iterator(classes[0])) images.push_back(e.path());
  std::sort(images.begin(), images.end());
  ASSERT_GE(images.size(), 2u);
  write_file(images[0], "not an image\n");
  // The token stream's text: any bytes do (the KJV text of the example is
  // made by examples/charlm/prepare.sh, not in the repository).
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog.\n";
  write_file(dir / "text.txt", text);

  std::vector<Probed> cases{
      {"kiln.synthetic", {}, {}, "mlp", {}, {}},
      {"kiln.arrays", own("npy.toml"), dir.path(), "mlp", short_run, {}},
      {"kiln.csv", own("csv.toml"), dir.path(), "mlp", short_run, {}},
      {"kiln.image_folder",
       own("images.toml"),
       dir.path(),
       "cnn",
       {"trainer.max_epochs=2", "data.val_fraction=0.0", "data.skip_unreadable=true", "trainer.test_after_fit=true"},
       {"[kiln.image_folder] train: 1 unreadable image replaced by the next readable one in epoch 0 (skip_unreadable)",
        "[kiln.image_folder] train: 1 unreadable image replaced by the next readable one in epoch 1 (skip_unreadable)"}},
      {"kiln.fashion_mnist",
       source_dir() / "examples" / "fashion_mnist" / "mlp.toml",
       dir.path(),
       "mlp",
       {"trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
        "trainer.test_after_fit=false"},
       {}},
      {"kiln.token_stream",
       source_dir() / "examples" / "charlm" / "run.toml",
       dir.path(),
       "charlm",
       {"data.file=" + (dir / "text.txt").string(), "trainer.max_steps=3",
        "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1", "model.n_layer=1"},
       {}}};
  // The synthetic run: the tests' small manifest.
  cases[0].manifest = write_run_manifest(dir, RunManifest{.trainer = trainer_keys(2, 32)});
  cases[0].cwd = dir.path();
  for (const Probed& c : cases) expect_no_trace(c);
}

}  // namespace
}  // namespace kiln::test
