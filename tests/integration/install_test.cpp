// kiln is really an SDK: install it to a prefix, build the out-of-tree
// example against it with find_package(Kiln) and kiln_add_plugin(), and train
// with the installed kiln.
#include <gtest/gtest.h>

#include <algorithm>

#include "common.hpp"

namespace kiln::test {
namespace {

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
