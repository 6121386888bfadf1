// Run manifests (run.toml) for the integration tests: one writer, where a
// test states only the tables, or the keys, that differ from a small run of
// the shipped MLP on the synthetic data module.
//
// Manifests whose hand-written text is the point of a test (a TOML syntax
// error, a legacy key, the bad-input catalogue's text edits) are written by
// hand in that test instead.
#pragma once

#include <filesystem>
#include <string>

#include "support/run_process.hpp"

namespace kiln::test {

// [model]'s keys for the shipped MLP; `hidden` as TOML ("[32]", "[]").
inline std::string mlp_keys(int in_features, const std::string& hidden, int classes) {
  return "path = \"kiln_mlp\"\nin_features = " + std::to_string(in_features) + "\nhidden = " + hidden +
         "\nclasses = " + std::to_string(classes) + "\n";
}

// [data]'s keys for the synthetic data module, then `more`.
inline std::string synthetic_keys(int features, int classes, const std::string& more = "") {
  return "path = \"kiln_synthetic\"\nfeatures = " + std::to_string(features) + "\nclasses = " +
         std::to_string(classes) + "\n" + more;
}

// [trainer]'s keys for a run without a progress bar, then `more`.
inline std::string trainer_keys(int max_epochs, int batch_size, const std::string& more = "") {
  return "max_epochs = " + std::to_string(max_epochs) + "\nbatch_size = " + std::to_string(batch_size) +
         "\nprogress = \"none\"\n" + more;
}

// A manifest table by table, each field its table's TOML lines. The defaults
// are synthetic_manifest's run; write designated initializers for the rest.
struct RunManifest {
  std::string name = "synthetic";  // [run] name; empty: no name key
  std::string run_dir;             // [run] dir as written; empty: the test's dir / "run"
  std::string run = "seed = 3\nthreads = 1\n";  // [run]'s other keys
  std::string model = mlp_keys(32, "[32]", 4);
  std::string data = synthetic_keys(32, 4);
  std::string trainer = trainer_keys(3, 32);
  std::string optimizer = "name = \"adam\"\nlr = 0.01\n";  // empty: no [optimizer] table
  std::string extra;                // appended as is: start it with "\n[table]"
  std::string file = "run.toml";    // under the test's dir
};

// Writes `m` to dir / m.file; returns that path.
inline std::filesystem::path write_run_manifest(const std::filesystem::path& dir, const RunManifest& m) {
  const std::string run_dir = m.run_dir.empty() ? (dir / "run").string() : m.run_dir;
  std::string text = "[run]\n";
  if (!m.name.empty()) text += "name = \"" + m.name + "\"\n";
  text += "dir = \"" + run_dir + "\"\n" + m.run + "\n[model]\n" + m.model + "\n[data]\n" + m.data + "\n[trainer]\n" +
          m.trainer;
  if (!m.optimizer.empty()) text += "\n[optimizer]\n" + m.optimizer;
  write_file(dir / m.file, text + m.extra);
  return dir / m.file;
}
inline std::filesystem::path write_run_manifest(const TempDir& dir, const RunManifest& m) {
  return write_run_manifest(dir.path(), m);
}

// A small run on the synthetic data module with the shipped MLP; `extra` is
// appended as is (after [optimizer]'s keys).
inline std::filesystem::path synthetic_manifest(const TempDir& dir, const std::string& extra = "") {
  return write_run_manifest(dir, {.extra = extra});
}

// A run of the recorder plugins; `model`, `data`, `callback` and `extra` are
// TOML lines added to those tables and to the end of the manifest.
inline std::filesystem::path recorder_manifest(const TempDir& dir, const std::string& model, const std::string& data,
                                               const std::string& callback, const std::string& extra) {
  const std::string library = (test_plugin_dir() / "libkiln_test_recorder.so").string();
  const std::string log = (dir / "calls.log").string();
  auto table = [&](const std::string& header, const std::string& id, const std::string& lines) {
    return header + "\npath = \"" + library + "\"\nid = \"" + id + "\"\nlog = \"" + log + "\"\n" + lines + "\n";
  };
  write_file(dir / "run.toml", "[run]\nname = \"dist\"\ndir = \"" + (dir / "run").string() +
                                   "\"\nthreads = 1\nseed = 5\n\n" + table("[model]", "test.recorder_model", model) +
                                   table("[data]", "test.recorder_data", data) +
                                   table("[[callbacks]]", "test.recorder_callback", callback) +
                                   "[trainer]\nprogress = \"none\"\n" + extra + "\n");
  return dir / "run.toml";
}

}  // namespace kiln::test
