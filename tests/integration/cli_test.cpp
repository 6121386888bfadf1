// The `kiln` command line: help, version, inspect, overrides, and bad input
// that exits 2 without touching the disk.
#include <gtest/gtest.h>

#include "common.hpp"

namespace kiln::test {
namespace {

TEST(Cli, VersionNamesAbiAndLibTorch) {
  const ProcessResult r = kiln({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("kiln 0.1.0 (ABI 1.5, LibTorch "), std::string::npos) << r.output;
}

TEST(Cli, HelpListsTheCommands) {
  const ProcessResult r = kiln({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* command : {"fit", "validate", "test", "predict", "inspect", "manifest-reference"})
    EXPECT_NE(r.output.find(command), std::string::npos) << command;
}

// --log-level on the command line wins over the manifest's run.log_level
// (which used to reset it as soon as the manifest was read).
TEST(Cli, TheCommandLinesLogLevelWinsOverTheManifests) {
  TempDir dir;
  write_run_manifest(dir, {.name = "",
                           .run = "log_level = \"info\"\nthreads = 1\n",
                           .model = mlp_keys(8, "[]", 2),
                           .data = synthetic_keys(8, 2, "train_size = 16\nval_size = 0\n"),
                           .trainer = "max_epochs = 1\nprogress = \"none\"\n",
                           .optimizer = ""});
  const ProcessResult debug = kiln({"--log-level", "debug", "fit", (dir / "run.toml").string()});
  ASSERT_EQ(debug.exit_code, 0) << debug.output;
  EXPECT_NE(debug.output.find("start-up: plugins set up"), std::string::npos) << debug.output;
  // After the command too, where torchrun-style command lines put it.
  const ProcessResult after = kiln({"fit", (dir / "run.toml").string(), "--log-level", "debug", "--set",
                                    "run.dir=" + (dir / "after").string()});
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_NE(after.output.find("start-up: plugins set up"), std::string::npos) << after.output;
  const ProcessResult info = kiln({"fit", (dir / "run.toml").string(), "--set", "run.dir=" + (dir / "again").string()});
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_EQ(info.output.find("start-up: plugins set up"), std::string::npos) << "the manifest's level without the flag";
}

TEST(Cli, UnknownCommandIsBadInput) {
  EXPECT_EQ(kiln({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(kiln({}).exit_code, 2);
}

TEST(Cli, ManifestReferencePrintsEveryTable) {
  const ProcessResult r = kiln({"manifest-reference"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("# Manifest reference\n", 0), 0u) << r.output;
  for (const char* table :
       {"[run]", "[trainer]", "[optimizer]", "[scheduler]", "[checkpoint]", "[distributed]", "[metrics]"})
    EXPECT_NE(r.output.find(std::string("\n## ") + table + "\n"), std::string::npos) << table;
}

TEST(Cli, InspectAPluginLibrary) {
  const ProcessResult r = kiln({"inspect", (plugin_dir() / "libkiln_mlp.so").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kiln.mlp"), std::string::npos);
  EXPECT_NE(r.output.find("kind:          model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ABI:           1.5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training_step"), std::string::npos) << r.output;
}

TEST(Cli, InspectAManifestResolvesEveryPlugin) {
  TempDir dir;
  const ProcessResult r = kiln({"inspect", synthetic_manifest(dir).string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[model] kiln.mlp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[data] kiln.synthetic"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("concurrent get_batch"), std::string::npos) << r.output;
}

TEST(Cli, InspectAManifestSummarisesTheConfiguredModelAndWritesNothing) {
  TempDir dir;
  const ProcessResult r = kiln({"inspect", synthetic_manifest(dir).string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The shipped MLP as configured: 32 -> 32 -> 4.
  EXPECT_NE(r.output.find("model summary (kiln.mlp, as configured by the manifest)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0 | fc1  | 1.1 K  | yes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 | fc2  | 132    | yes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1.2 K     Total params"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

TEST(Cli, InspectAManifestWhoseModelRefusesItsConfigExits2) {
  TempDir dir;
  const auto manifest = synthetic_manifest(dir);
  std::string text = read_file(manifest);
  text.replace(text.find("classes = 4"), 11, "classes = -4");
  write_file(manifest, text);
  const ProcessResult r = kiln({"inspect", manifest.string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("plugin 'kiln.mlp' [model] failed in create: 'classes' must be positive"), std::string::npos)
      << r.output;
}

TEST(Cli, UnknownManifestKeyExits2WithLocationAndSuggestion) {
  TempDir dir;
  const auto manifest = synthetic_manifest(dir, "\n[scheduler]\nnmae = \"step\"\n");
  const ProcessResult r = kiln({"fit", manifest.string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run.toml:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'name'?"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

TEST(Cli, UnknownPluginKeyIsRefusedWithSuggestion) {
  TempDir dir;
  const auto manifest = synthetic_manifest(dir);
  const ProcessResult r = kiln({"fit", manifest.string(), "--set", "model.hiden=[8]"});
  // The SDK reports a config error as KILN_ERROR_INVALID_ARGUMENT (ABI 1.1):
  // bad input, exit 2, nothing written.
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("failed in create"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'hiden' (did you mean 'hidden'?)"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "a refused config leaves no run directory";
}

TEST(Cli, SetOverridesAnyKey) {
  TempDir dir;
  const auto manifest = synthetic_manifest(dir);
  const ProcessResult r = kiln({"fit", manifest.string(), "--set", "trainer.max_epochs=1", "--set",
                                "run.dir=" + (dir / "other").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "other" / "metrics.csv");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("epoch"), 0);
}

TEST(Cli, MissingManifestExits2) {
  const ProcessResult r = kiln({"fit", "/nonexistent/run.toml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("run.toml"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kiln::test
