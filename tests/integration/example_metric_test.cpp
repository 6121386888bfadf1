// examples/whole_split_metric as a user runs it: its own run.toml, two
// processes. Each validation epoch logs AUROC and macro-F1 over the whole
// split into metrics.csv and prints the confusion matrix; validating the
// trained weights again in one process gives the same values, bit for bit
// (what its README promises).
#include <gtest/gtest.h>

#include "common.hpp"

namespace kiln::test {
namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(ExampleMetric, LogsAurocAndF1WithTwoProcessesAndOneProcessValidatesToTheSameBits) {
  TempDir dir("kiln-example-metric");
  const ProcessResult r =
      kiln_fit(source_dir() / "examples" / "whole_split_metric" / "run.toml",
               {"-n", "2", "--set", "run.dir=" + (dir / "run").string(), "--set", "trainer.progress=none"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int epochs = 0;
  for (const auto& row : read_metrics(dir / "run" / "metrics.csv")) {
    if (!row.count("val/auroc")) continue;
    ++epochs;
    ASSERT_TRUE(row.count("val/f1_macro")) << r.output;
    for (const char* name : {"val/auroc", "val/f1_macro"}) {
      EXPECT_GE(row.at(name), 0.0) << name;
      EXPECT_LE(row.at(name), 1.0) << name;
    }
    // Better than chance after an epoch, not perfect on the noisy data.
    EXPECT_GT(row.at("val/auroc"), 0.6);
  }
  EXPECT_EQ(epochs, 2) << r.output;
  EXPECT_EQ(count(r.output, "val confusion matrix over 1024 samples"), 2u) << r.output;

  const ProcessResult v = kiln({"validate", (source_dir() / "examples" / "whole_split_metric" / "run.toml").string(),
                                "--ckpt", (dir / "run" / "checkpoints" / "last.ckpt").string(), "--set",
                                "run.dir=" + (dir / "validate").string(), "--set", "trainer.progress=none"});
  ASSERT_EQ(v.exit_code, 0) << v.output;
  const auto fitted = read_metrics(dir / "run" / "metrics.csv");
  const auto validated = read_metrics(dir / "validate" / "metrics.csv");
  // The last row is kiln validate's own (no training columns).
  ASSERT_FALSE(validated.empty());
  ASSERT_FALSE(validated.back().count("train/loss")) << read_file(dir / "validate" / "metrics.csv");
  for (const char* name : {"val/auroc", "val/f1_macro"}) {
    ASSERT_TRUE(validated.back().count(name)) << name << "\n" << v.output;
    EXPECT_EQ(validated.back().at(name), last_value(fitted, name)) << name;
  }
}

}  // namespace
}  // namespace kiln::test
