// Unit tests for optimizer parameter groups (runtime/optim/param_groups.cpp):
// glob patterns over parameter names, the first matching group taking a
// parameter, the errors a person reads, and the description a checkpoint
// keeps (and its comparison on resume).
#include "optim/param_groups.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/errors.hpp"

namespace kiln {
namespace {

const std::vector<std::string> kNames = {"encoder.fc1.weight", "encoder.fc1.bias", "encoder.norm.weight",
                                         "head.weight", "head.bias"};
const std::vector<bool> kAllTrained(kNames.size(), true);

OptimizerGroupConfig group(std::vector<std::string> match, std::optional<double> weight_decay = std::nullopt) {
  OptimizerGroupConfig g;
  g.match = std::move(match);
  g.weight_decay = weight_decay;
  g.where = "run.toml:9:9";
  return g;
}

// The InputError message, or "" when planning succeeds.
std::string error(const OptimizerConfig& c, const std::vector<bool>& trained = kAllTrained) {
  try {
    plan_param_groups(c, kNames, trained, "net");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(GlobMatch, StarCrossesDotsAndTheWholeNameMustMatch) {
  EXPECT_TRUE(glob_match("*.bias", "encoder.fc1.bias"));
  EXPECT_TRUE(glob_match("*norm*", "encoder.norm.weight"));
  EXPECT_TRUE(glob_match("encoder.*", "encoder.fc1.weight"));
  EXPECT_TRUE(glob_match("fc?.weight", "fc1.weight"));
  EXPECT_TRUE(glob_match("fc[12].bias", "fc2.bias"));
  EXPECT_FALSE(glob_match("fc[!12].bias", "fc2.bias"));
  EXPECT_FALSE(glob_match("bias", "head.bias"));      // not a substring search
  EXPECT_FALSE(glob_match("*.bias", "head.bias_x"));
  EXPECT_TRUE(glob_match("head.bias", "head.bias"));
}

TEST(PlanParamGroups, WithoutGroupsEverythingIsTheDefaultGroup) {
  OptimizerConfig c;
  const auto groups = plan_param_groups(c, kNames, kAllTrained, "net");
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].label, "optimizer");
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
}

TEST(PlanParamGroups, TheFirstMatchingGroupTakesAParameterAndTheRestStayDefault) {
  OptimizerConfig c;
  c.weight_decay = 0.01;
  c.groups = {group({"*.bias", "*norm*"}, 0.0), group({"encoder.*"})};
  c.groups[1].lr = 1e-4;
  const auto groups = plan_param_groups(c, kNames, kAllTrained, "net");
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].label, "optimizer");  // the default group first
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{3}));
  EXPECT_DOUBLE_EQ(groups[0].options.weight_decay, 0.01);
  EXPECT_EQ(groups[1].label, "optimizer.groups[0]");
  EXPECT_EQ(groups[1].members, (std::vector<std::size_t>{1, 2, 4}));
  EXPECT_DOUBLE_EQ(groups[1].options.weight_decay, 0.0);
  EXPECT_EQ(groups[2].label, "optimizer.groups[1]");
  EXPECT_EQ(groups[2].members, (std::vector<std::size_t>{0}));  // encoder's bias and norm went to groups[0]
  EXPECT_DOUBLE_EQ(groups[2].options.lr, 1e-4);
  EXPECT_DOUBLE_EQ(groups[2].options.weight_decay, 0.01);  // [optimizer]'s
}

TEST(PlanParamGroups, NoDefaultGroupWhenTheGroupsTakeEverything) {
  OptimizerConfig c;
  c.groups = {group({"*"})};
  const auto groups = plan_param_groups(c, kNames, kAllTrained, "net");
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].label, "optimizer.groups[0]");
}

TEST(PlanParamGroups, MembersIndexTheTrainableParametersOnly) {
  OptimizerConfig c;
  c.groups = {group({"head.*"})};
  const auto groups = plan_param_groups(c, kNames, {false, true, true, true, true}, "net");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{0, 1}));  // encoder.fc1.bias, encoder.norm.weight
  EXPECT_EQ(groups[1].members, (std::vector<std::size_t>{2, 3}));
}

TEST(PlanParamGroups, APatternMatchingNothingNamesTheKeyAndListsTheParameters) {
  OptimizerConfig c;
  c.groups = {group({"*.bias"}), group({"*.bais"})};
  EXPECT_EQ(error(c),
            "run.toml:9:9: optimizer.groups[1].match: '*.bais' matches no parameter of model 'net' (its parameters: "
            "encoder.fc1.weight, encoder.fc1.bias, encoder.norm.weight, head.weight, head.bias)");
}

TEST(PlanParamGroups, ALongParameterListIsCut) {
  std::vector<std::string> names;
  for (int i = 0; i < 30; ++i) names.push_back("p" + std::to_string(i));
  OptimizerConfig c;
  c.groups = {group({"q*"})};
  try {
    plan_param_groups(c, names, std::vector<bool>(names.size(), true), "net");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("p19, ... (10 more))"), std::string::npos) << message;
    EXPECT_EQ(message.find("p20"), std::string::npos) << message;
  }
}

TEST(PlanParamGroups, AGroupLeftWithNothingToTrainIsRefused) {
  OptimizerConfig c;
  c.groups = {group({"*.bias"}), group({"head.bias"})};
  const std::string message = error(c);
  EXPECT_NE(message.find("run.toml:9:9: optimizer.groups[1].match: 'head.bias' leaves the group no parameter"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("taken by an earlier group"), std::string::npos) << message;
}

TEST(ParamGroupsDescription, TheSameGroupsAgreeAndADifferenceIsNamed) {
  OptimizerConfig c;
  c.weight_decay = 0.01;
  c.groups = {group({"*.bias"}, 0.0)};
  std::vector<std::string> trainable = kNames;
  const std::string saved = describe_param_groups(plan_param_groups(c, kNames, kAllTrained, "net"), trainable);
  EXPECT_NE(saved.find("group optimizer.groups[0]\nmatch '*.bias'\nparameters encoder.fc1.bias, head.bias\n"),
            std::string::npos)
      << saved;
  EXPECT_EQ(param_groups_difference(saved, saved), std::nullopt);

  OptimizerConfig other = c;
  other.groups[0].weight_decay = 0.1;
  EXPECT_EQ(param_groups_difference(saved, describe_param_groups(plan_param_groups(other, kNames, kAllTrained, "net"), trainable)),
            "optimizer.groups[0].weight_decay is 0.0 in the checkpoint but 0.1 in the manifest");

  other = c;
  other.groups[0].match = {"head.*"};
  EXPECT_EQ(param_groups_difference(saved, describe_param_groups(plan_param_groups(other, kNames, kAllTrained, "net"), trainable)),
            "optimizer.groups[0].match is '*.bias' in the checkpoint but 'head.*' in the manifest");

  other = c;
  other.groups.clear();
  EXPECT_EQ(param_groups_difference(saved, describe_param_groups(plan_param_groups(other, kNames, kAllTrained, "net"), trainable)),
            "the checkpoint has optimizer.groups[0] (match '*.bias') but the manifest has no such group");

  // The same groups over a model whose frozen parameters changed: the
  // members differ.
  EXPECT_EQ(param_groups_difference(saved, describe_param_groups(plan_param_groups(c, kNames, {false, true, true, true, true}, "net"),
                                                                 {kNames.begin() + 1, kNames.end()})),
            "the default group holds encoder.fc1.weight, encoder.norm.weight, head.weight in the checkpoint but "
            "encoder.norm.weight, head.weight in the manifest");

  other = c;
  other.name = OptimizerName::sgd;
  EXPECT_EQ(param_groups_difference(saved, describe_param_groups(plan_param_groups(other, kNames, kAllTrained, "net"), trainable)),
            "optimizer.name is 'adam' in the checkpoint but 'sgd' in the manifest");
}

}  // namespace
}  // namespace kiln
