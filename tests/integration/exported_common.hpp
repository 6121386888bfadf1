// What the tests of exported programs share (exported_test.cpp,
// hugging_face_test.cpp): scripts run by the checking Python (the torch
// wheel's), the losses they print against kiln's, and the manifest keys.
#pragma once

#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common.hpp"
#include "logged_files.hpp"

namespace kiln::test {

constexpr auto kTimeout = std::chrono::seconds(600);

#define KILN_REQUIRE_EXPORTED_PLUGIN()                                                                  \
  do {                                                                                                  \
    if (!std::filesystem::exists(plugin_dir() / "libkiln_exported.so"))                                 \
      GTEST_SKIP() << "kiln_exported is built against LibTorch 2.x only (./go test --torch wheel runs " \
                      "these)";                                                                         \
    KILN_REQUIRE_CHECK_PYTHON();                                                                        \
  } while (0)

// A script of the test's, run by the checking Python with the python/
// folder, the test's directory and `args` as its arguments.
inline ProcessResult run_script(const TempDir& dir, const std::string& file, const std::string& text,
                         const std::vector<std::string>& args) {
  write_file(dir / file, text);
  std::vector<std::string> argv{check_python().string(), (dir / file).string(), (source_dir() / "python").string(),
                                dir.path().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {.timeout = kTimeout});
}

// The values of the "<key> <value>" lines a script printed, in order.
inline std::vector<double> printed(const std::string& output, const std::string& key) {
  std::vector<double> out;
  std::istringstream words(output);
  for (std::string word; words >> word;)
    if (word == key) {
      double v = 0;
      if (words >> v) out.push_back(v);
    }
  return out;
}

// kiln's per-step losses are the eager loop's, 20 of them, to 1e-5 relative.
inline void expect_the_eager_losses(const std::vector<double>& got, const ProcessResult& eager) {
  const std::vector<double> want = printed(eager.output, "loss");
  ASSERT_EQ(want.size(), 20u) << eager.output;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
}

// A script's "max_abs_diff" line is under 1e-5.
inline void expect_the_same_outputs(const ProcessResult& back) {
  ASSERT_EQ(back.exit_code, 0) << back.output;
  const std::vector<double> diff = printed(back.output, "max_abs_diff");
  ASSERT_EQ(diff.size(), 1u) << back.output;
  EXPECT_LT(diff[0], 1e-5) << back.output;
}

// [model]'s keys for the exported program `file` (under `dir`), then `more`.
inline std::string exported_keys(const TempDir& dir, const std::string& file, const std::string& more = "") {
  return "path = \"kiln_exported\"\nprogram = \"" + (dir / file).string() + "\"\n" + more;
}

// [trainer]'s keys that make a run's batches an eager loop's: in order, every
// step logged, read on the training thread.
inline const std::string kInOrder = "shuffle = false\nlog_every_n_steps = 1\ndata_workers = 0\n";

inline const std::string kCsvAndJsonl = "\n[logging]\nloggers = [\"csv\", \"jsonl\"]\n";

inline std::vector<double> step_losses(const std::filesystem::path& jsonl) {
  std::vector<double> out;
  for (const auto& row : read_jsonl(jsonl))
    if (row.at("kind") == "step") out.push_back(std::stod(row.at("train/loss_step")));
  return out;
}

}  // namespace kiln::test
