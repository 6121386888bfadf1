// The stable-ABI promise, with real plugins: a plugin compiled against the
// verbatim ABI 1.0 header (tests/abi/v1_0) loads and trains in this 1.1 host.
#include <gtest/gtest.h>

#include "common.hpp"

namespace kiln::test {
namespace {

TEST(AbiCompat, PluginBuiltAgainstAbi1_0TrainsInThisHost) {
  const auto plugin = test_plugin_dir() / "libkiln_test_c_blobs_abi_1_0.so";
  const ProcessResult inspect = kiln({"inspect", plugin.string()});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("ABI:           1.0"), std::string::npos) << inspect.output;

  TempDir dir;
  const ProcessResult r = kiln({"fit", synthetic_manifest(dir).string(), "--set", "data.path=" + plugin.string(), "--set",
                                "data.features=32", "--set", "data.classes=4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_GT(rows.back().at("val/acc"), 0.8) << r.output;
}

}  // namespace
}  // namespace kiln::test
