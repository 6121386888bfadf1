// A plugin built against the other LibTorch (Debian's 1.13 and a 2.x wheel)
// is refused in both directions, before it is loaded: one line naming the
// cause, exit 2, and no run directory. Needs both builds:
// `./go test --torch wheel` configures this build with Debian's build/ as
// KILN_OTHER_TORCH_BUILD; without it the test skips with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "manifests.hpp"
#include "support/run_process.hpp"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

const fs::path this_build = KILN_TEST_BUILD_DIR;
const fs::path other_build = KILN_OTHER_TORCH_BUILD;

bool built(const fs::path& build) {
  return fs::exists(build / "bin" / "kiln") && fs::exists(build / "lib" / "kiln" / "plugins" / "libkiln_mlp.so");
}

void expect_refused(const fs::path& host_build, const fs::path& plugin_build) {
  TempDir dir;
  const fs::path plugin = plugin_build / "lib" / "kiln" / "plugins" / "libkiln_mlp.so";
  write_run_manifest(dir, {.name = "cross",
                           .run = "",
                           .model = "path = \"" + plugin.string() + "\"\n",
                           .data = "path = \"kiln_synthetic\"\n",
                           .trainer = "max_epochs = 1\nprogress = \"none\"\n",
                           .optimizer = ""});
  const ProcessResult r = run_process({(host_build / "bin" / "kiln").string(), "fit", (dir / "run.toml").string()},
                                      {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto lines = std::count(r.output.begin(), r.output.end(), '\n');
  EXPECT_EQ(lines, 1) << "one line, no backtrace:\n" << r.output;
  EXPECT_NE(r.output.find("kiln: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was built against another LibTorch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rebuild the plugin with the same LibTorch"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run")) << "a refused run must not touch the disk";
}

class CrossLibTorch : public testing::Test {
 protected:
  void SetUp() override {
    if (other_build.empty() || !built(other_build))
      GTEST_SKIP() << "needs a kiln built against the other LibTorch (./go build; ./go test --torch wheel)";
    ASSERT_TRUE(built(this_build));
  }
};

TEST_F(CrossLibTorch, ThisHostRefusesTheOtherBuildsPlugin) { expect_refused(this_build, other_build); }

TEST_F(CrossLibTorch, TheOtherHostRefusesThisBuildsPlugin) { expect_refused(other_build, this_build); }

}  // namespace
}  // namespace kiln::test
