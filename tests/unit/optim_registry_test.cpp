// Unit tests for the optimizer and schedule registry
// (runtime/optim/optim_registry.cpp): one entry per name the manifest offers,
// and each optimizer's state survives save -> load exactly.
#include "optim/optim_registry.hpp"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/manifest_schema.hpp"
#include "optim/optim.hpp"
#include "optim/param_groups.hpp"

namespace kiln {
namespace {

// Reads fields back as a checkpoint would, from what save_state gave.
class FieldsReader : public ParamStateReader {
 public:
  explicit FieldsReader(const ParamStateFields& fields) {
    for (const auto& [name, t] : fields.tensors) tensors_[name] = t.clone();
    for (const auto& [name, text] : fields.texts) texts_[name] = text;
  }
  bool has(const std::string& field) const override { return tensors_.count(field) || texts_.count(field); }
  at::Tensor tensor(const std::string& field) const override { return tensors_.at(field); }
  int64_t count(const std::string& field) const override { return std::stoll(texts_.at(field)); }

 private:
  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, std::string> texts_;
};

TEST(OptimizerRegistry, OneEntryPerNameTheManifestOffers) {
  const auto& names = find_key_schema("optimizer", "name")->choices;
  ASSERT_EQ(optimizer_registry().size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    const OptimizerEntry& entry = optimizer_registry()[i];
    EXPECT_EQ(option_name(entry.name), names[i]);
    EXPECT_EQ(&optimizer_entry(entry.name), &entry);
    EXPECT_TRUE(entry.build && entry.save_state && entry.load_state) << names[i];
  }
}

TEST(ScheduleRegistry, OneEntryPerNameTheManifestOffers) {
  const auto& names = find_key_schema("scheduler", "name")->choices;
  ASSERT_EQ(schedule_registry().size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(option_name(schedule_registry()[i].name), names[i]);
    EXPECT_NE(schedule_registry()[i].lr, nullptr) << names[i];
  }
}

class OptimizerRoundTrip : public ::testing::TestWithParam<OptimizerName> {};

// Build, take steps, save each parameter's state, load it into a fresh
// optimizer: the next step of both moves the parameters identically.
TEST_P(OptimizerRoundTrip, StateSurvivesSaveAndLoad) {
  torch::manual_seed(0);
  OptimizerConfig config;
  config.name = GetParam();
  config.lr = 0.1;
  config.momentum = 0.9;    // sgd, rmsprop: a momentum buffer to carry
  config.centered = true;   // rmsprop: grad_avg too
  config.lr_decay = 0.01;   // adagrad: the step matters
  std::vector<at::Tensor> original = {torch::randn({3, 2}).requires_grad_(), torch::randn({2}).requires_grad_()};
  auto loss_of = [](const std::vector<at::Tensor>& p) { return (p[0].sum(1) * p[1].sum() + p[0].pow(2).sum()).sum(); };

  const OptimizerEntry& entry = optimizer_entry(config.name);
  auto trained = make_optimizer(config, original);
  EXPECT_EQ(optimizer_entry_of(*trained), &entry);
  for (int step = 0; step < 3; ++step) {
    trained->zero_grad();
    loss_of(original).backward();
    trained->step();
  }

  std::vector<at::Tensor> copy;
  for (const auto& p : original) copy.push_back(p.detach().clone().requires_grad_());
  auto resumed = make_optimizer(config, copy);
  for (std::size_t i = 0; i < original.size(); ++i) {
    const auto& state = *trained->state().at(optimizer_state_key(original[i]));
    const ParamStateFields fields = entry.save_state(state);
    const FieldsReader reader(fields);
    ASSERT_TRUE(reader.has(entry.state_marker)) << entry.state_marker;
    resumed->state()[optimizer_state_key(copy[i])] = entry.load_state(reader);
    // What was loaded saves to the same fields.
    const ParamStateFields again =
        entry.save_state(*resumed->state().at(optimizer_state_key(copy[i])));
    ASSERT_EQ(again.texts, fields.texts);
    ASSERT_EQ(again.tensors.size(), fields.tensors.size());
    for (std::size_t t = 0; t < fields.tensors.size(); ++t) {
      EXPECT_EQ(again.tensors[t].first, fields.tensors[t].first);
      EXPECT_TRUE(torch::equal(again.tensors[t].second, fields.tensors[t].second)) << fields.tensors[t].first;
    }
  }

  for (auto [params, optimizer] : {std::make_pair(&original, trained.get()), std::make_pair(&copy, resumed.get())}) {
    optimizer->zero_grad();
    loss_of(*params).backward();
    optimizer->step();
  }
  for (std::size_t i = 0; i < original.size(); ++i) EXPECT_TRUE(torch::equal(original[i], copy[i])) << i;
}

// Two groups, each with its own options: torch steps each group with them.
TEST(OptimizerGroups, EachGroupStepsWithItsOwnOptions) {
  OptimizerConfig config;
  config.name = OptimizerName::sgd;
  config.lr = 0.1;
  OptimizerGroupConfig slow;
  slow.match = {"b"};
  slow.lr = 0.01;
  config.groups = {slow};
  std::vector<at::Tensor> params = {torch::ones({2}).requires_grad_(), torch::ones({2}).requires_grad_()};
  const auto groups = plan_param_groups(config, {"a", "b"}, {true, true}, "m");
  auto optimizer = make_optimizer(config, groups, params);
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  EXPECT_DOUBLE_EQ(optimizer->param_groups()[0].options().get_lr(), 0.1);
  EXPECT_DOUBLE_EQ(optimizer->param_groups()[1].options().get_lr(), 0.01);
  (params[0].sum() + params[1].sum()).backward();  // gradient 1 everywhere
  optimizer->step();
  EXPECT_TRUE(torch::allclose(params[0], torch::full({2}, 0.9)));
  EXPECT_TRUE(torch::allclose(params[1], torch::full({2}, 0.99)));
}

// LibTorch's Adagrad fills every sum with the defaults' value; a group's own
// initial_accumulator_value is what torch.optim.Adagrad uses.
TEST(OptimizerGroups, AdagradStartsEachGroupFromItsOwnAccumulator) {
  OptimizerConfig config;
  config.name = OptimizerName::adagrad;
  config.initial_accumulator_value = 0.5;
  OptimizerGroupConfig g;
  g.match = {"b"};
  g.initial_accumulator_value = 2.0;
  config.groups = {g};
  std::vector<at::Tensor> params = {torch::ones({2}).requires_grad_(), torch::ones({3}).requires_grad_()};
  auto optimizer = make_optimizer(config, plan_param_groups(config, {"a", "b"}, {true, true}, "m"), params);
  auto sum_of = [&](const at::Tensor& p) {
    return static_cast<torch::optim::AdagradParamState&>(*optimizer->state().at(optimizer_state_key(p))).sum();
  };
  EXPECT_TRUE(torch::equal(sum_of(params[0]), torch::full({2}, 0.5)));
  EXPECT_TRUE(torch::equal(sum_of(params[1]), torch::full({3}, 2.0)));
}

std::vector<OptimizerName> every_optimizer_name() {
  std::vector<OptimizerName> names;
  for (std::size_t i = 0; i < option_count<OptimizerName>(); ++i) names.push_back(static_cast<OptimizerName>(i));
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, OptimizerRoundTrip, ::testing::ValuesIn(every_optimizer_name()),
                         [](const ::testing::TestParamInfo<OptimizerName>& info) { return option_name(info.param); });

}  // namespace
}  // namespace kiln
