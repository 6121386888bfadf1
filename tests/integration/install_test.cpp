// kiln is really an SDK: install it to a prefix, build the out-of-tree
// example against it with find_package(Kiln) and kiln_add_plugin(), and train
// with the installed kiln.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>
#include <sstream>

#include "common.hpp"

namespace kiln::test {
namespace {

// `./go example` builds kiln and the shipped plugins alone (go's example
// case); the README's next step, `cmake --install build --prefix ...`, must
// then find every file it copies: each file an install rule copies without
// OPTIONAL is one of those targets' (go_example_outputs.txt, written by
// plugins/CMakeLists.txt). The in-tree examples' plugins are OPTIONAL:
// installed once ./go build or ./go test built them.
TEST(Install, WhatInstallCopiesIsWhatGoExampleBuilds) {
  const std::string go = read_file(source_dir() / "go");
  const size_t example = go.find("\n  example)\n");
  ASSERT_NE(example, std::string::npos) << "go's example case";
  const size_t targets = go.find("BUILD_TARGETS=(", example);
  ASSERT_NE(targets, std::string::npos);
  EXPECT_EQ(go.substr(targets, go.find('\n', targets) - targets), "BUILD_TARGETS=(kiln kiln_shipped_plugins)")
      << "./go example builds other targets than go_example_outputs.txt lists";
  std::set<std::string> built;
  {
    std::istringstream in(read_file(std::filesystem::path(KILN_TEST_BUILD_DIR) / "go_example_outputs.txt"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) built.insert(line);
  }
  ASSERT_GT(built.size(), 5u);
  const std::regex rule(R"(file\(INSTALL [^)]*\))"), file(R"re("([^"$]+)")re");
  int checked = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(KILN_TEST_BUILD_DIR)) {
    if (entry.path().filename() != "cmake_install.cmake") continue;
    const std::string text = read_file(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), rule), end; it != end; ++it) {
      const std::string r = it->str();
      if (r.find(" OPTIONAL ") != std::string::npos) continue;
      if (!std::regex_search(r, std::regex("TYPE (EXECUTABLE|MODULE|SHARED_LIBRARY|STATIC_LIBRARY)"))) continue;
      const std::string files = r.substr(r.find(" FILES "));
      for (std::sregex_iterator f(files.begin(), files.end(), file); f != end; ++f) {
        ++checked;
        EXPECT_TRUE(built.count((*f)[1].str()))
            << (*f)[1].str() << ": `cmake --install` copies it, `./go example` does not build it (" << entry.path()
            << "); build it there or mark its install OPTIONAL";
      }
    }
  }
  EXPECT_GT(checked, 5) << "no install rule found: the build's cmake_install.cmake files changed form";
}

TEST(Install, OutOfTreePluginBuildsAgainstTheInstalledSdkAndTrains) {
  // A minute of compiling: in CI it runs against the recent LibTorch most
  // users build plugins with (docs/testing.md); by hand, against either.
  KILN_ONLY_IN_VARIANT("wheel");
  TempDir dir("kiln-install");
  const auto prefix = dir / "prefix";
  const auto build = dir / "build";
  const std::string cmake = KILN_TEST_CMAKE;
  const ProcessOptions slow{.timeout = std::chrono::seconds(900)};

  ProcessResult r = run_process({cmake, "--install", KILN_TEST_BUILD_DIR, "--prefix", prefix.string()}, slow);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(prefix / "include" / "kiln" / "abi.h"));
  ASSERT_TRUE(std::filesystem::exists(prefix / "bin" / "kiln"));

  std::string torch_prefix = KILN_TEST_TORCH_PREFIX;
  std::replace(torch_prefix.begin(), torch_prefix.end(), '|', ';');
  r = run_process({cmake, "-S", (source_dir() / "examples" / "out_of_tree").string(), "-B", build.string(),
                   "-DCMAKE_BUILD_TYPE=Release",
                   "-DCMAKE_PREFIX_PATH=" + prefix.string() + ";" + torch_prefix},
                  slow);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_process({cmake, "--build", build.string(), "-j2"}, slow);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Two kiln_add_plugin() targets in one project: both build.
  const auto plugin = build / "libmy_logreg.so";
  const auto callback = build / "libmy_epoch_log.so";
  ASSERT_TRUE(std::filesystem::exists(plugin)) << r.output;
  ASSERT_TRUE(std::filesystem::exists(callback)) << r.output;

  // The example's manifest, with its plugin paths pointing at this build.
  std::string manifest = read_file(source_dir() / "examples" / "out_of_tree" / "run.toml");
  for (const auto& [from, to] : {std::pair{std::string("build/libmy_logreg.so"), plugin.string()},
                                 std::pair{std::string("build/libmy_epoch_log.so"), callback.string()}}) {
    const size_t at = manifest.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    manifest.replace(at, from.size(), to);
  }
  write_file(dir / "run.toml", manifest);
  // The installed kiln finds its installed plugins (kiln_synthetic) by name.
  r = run_process({(prefix / "bin" / "kiln").string(), "fit", (dir / "run.toml").string(), "--set",
                   "run.dir=" + (dir / "run").string(), "--set", "trainer.progress=none"},
                  slow);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("example.epoch_log: epoch 0 done"), std::string::npos) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_FALSE(rows.empty());
  EXPECT_GT(last_value(rows, "val/acc"), 0.8) << r.output;
}

}  // namespace
}  // namespace kiln::test
