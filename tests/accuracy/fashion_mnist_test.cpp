// The README's promise, on the real data: the shipped Fashion-MNIST
// manifests reach their accuracy targets within 5 epochs. These run serially
// (ctest RUN_SERIAL) with the manifests' own thread count, as a user runs them.
#include <gtest/gtest.h>

#include "../integration/common.hpp"

namespace kiln::test {
namespace {

ProcessResult fit(const std::filesystem::path& manifest, std::vector<std::string> extra) {
  std::vector<std::string> args{"fit", manifest.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return kiln(args, {.timeout = std::chrono::seconds(1500)});
}

TEST(FashionMnist, MlpReaches88PercentIn5Epochs) {
  TempDir dir;
  const auto manifest = source_dir() / "examples" / "fashion_mnist" / "mlp.toml";
  const ProcessResult r = fit(manifest, {"--set", "run.dir=" + (dir / "run").string(), "--set", "trainer.progress=none"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  EXPECT_LE(last_value(rows, "epoch"), 4);
  EXPECT_GE(last_value(rows, "test/acc"), 0.88) << r.output;
}

TEST(FashionMnist, CnnReaches90PercentIn5Epochs) {
  TempDir dir;
  const auto manifest = source_dir() / "examples" / "fashion_mnist" / "cnn.toml";
  const ProcessResult r = fit(manifest, {"--set", "run.dir=" + (dir / "run").string(), "--set", "trainer.progress=none"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  EXPECT_LE(last_value(rows, "epoch"), 4);
  EXPECT_GE(last_value(rows, "test/acc"), 0.90) << r.output;
}

}  // namespace
}  // namespace kiln::test
