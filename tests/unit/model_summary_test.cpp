// train/model_summary: Lightning's ModelSummary table from the names, sizes
// and trainable flags a model plugin reports.
#include <gtest/gtest.h>

#include "train/model_summary.hpp"

namespace kiln {
namespace {

TEST(ModelSummary, ShortCountsReadAsLightningsDo) {
  EXPECT_EQ(short_count(0), "0");
  EXPECT_EQ(short_count(999), "999");
  EXPECT_EQ(short_count(1000), "1.0 K");
  EXPECT_EQ(short_count(235146), "235 K");
  EXPECT_EQ(short_count(1234567), "1.2 M");
  EXPECT_EQ(short_count(7000000000), "7.0 B");
}

TEST(ModelSummary, OneRowPerTopLevelModuleThenTheTotals) {
  const std::vector<ParameterInfo> parameters{
      {"fc1.weight", 200704, 200704 * 4, true}, {"fc1.bias", 256, 256 * 4, true},
      {"embed.weight", 5000, 5000 * 4, false},  {"fc2.weight", 2560, 2560 * 4, true},
      {"fc2.bias", 10, 10 * 4, false},          {"scale", 1, 4, true}};
  const std::vector<std::string> lines = model_summary(parameters);
  ASSERT_EQ(lines.size(), 2u + 4u + 1u + 4u);
  EXPECT_EQ(lines[0], "    | Name  | Params | Trains");
  EXPECT_EQ(lines[2], "  0 | fc1   | 201 K  | yes");
  EXPECT_EQ(lines[3], "  1 | embed | 5.0 K  | no");
  EXPECT_EQ(lines[4], "  2 | fc2   | 2.6 K  | partly (2.6 K)");
  EXPECT_EQ(lines[5], "  3 | scale | 1      | yes");
  EXPECT_EQ(lines[7], "204 K     Trainable params");
  EXPECT_EQ(lines[8], "5.0 K     Non-trainable params");
  EXPECT_EQ(lines[9], "209 K     Total params");
  EXPECT_EQ(lines[10], "0.795     Total estimated model params size (MiB)");
}

}  // namespace
}  // namespace kiln
