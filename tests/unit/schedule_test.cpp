#include <gtest/gtest.h>

#include "optim/optim.hpp"

namespace kiln {
namespace {

TEST(LrSchedule, StepDecaysEveryStepSize) {
  SchedulerConfig c;
  c.name = SchedulerName::step;
  c.step_size = 2;
  c.gamma = 0.5;
  LrSchedule s(c, 1.0, 10);
  EXPECT_DOUBLE_EQ(s.lr(0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(1), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(2), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(5), 0.25);
}

TEST(LrSchedule, CosineGoesFromBaseToEtaMin) {
  SchedulerConfig c;
  c.name = SchedulerName::cosine;
  c.eta_min = 0.1;
  LrSchedule s(c, 1.0, 10);  // t_max = 0: the whole run
  EXPECT_DOUBLE_EQ(s.lr(0), 1.0);
  EXPECT_NEAR(s.lr(5), 0.55, 1e-12);
  EXPECT_NEAR(s.lr(10), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(20), 0.1, 1e-12);
}

TEST(LrSchedule, LinearWarmupRampsThenHolds) {
  SchedulerConfig c;
  c.name = SchedulerName::linear_warmup;
  c.warmup_steps = 4;
  c.warmup_start_factor = 0.0;
  LrSchedule s(c, 2.0, 100);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(2), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(4), 2.0);
  EXPECT_DOUBLE_EQ(s.lr(50), 2.0);
}

TEST(LrSchedule, AppliesToTheOptimizer) {
  SchedulerConfig c;
  c.name = SchedulerName::step;
  c.step_size = 1;
  c.gamma = 0.1;
  LrSchedule s(c, 1.0, 10);
  auto w = torch::zeros({2}, torch::requires_grad());
  OptimizerConfig oc;
  oc.name = OptimizerName::sgd;
  oc.lr = 1.0;
  auto optimizer = make_optimizer(oc, {w});
  s.apply(*optimizer, 2);
  EXPECT_NEAR(optimizer->param_groups()[0].options().get_lr(), 0.01, 1e-15);
}

// Each group is scheduled from its own base rate, as torch's schedulers do
// from each group's initial_lr; cosine's floor is shared.
TEST(LrSchedule, ScalesEachGroupFromItsOwnBaseRate) {
  SchedulerConfig c;
  c.name = SchedulerName::cosine;
  c.eta_min = 0.0;
  LrSchedule s(c, std::vector<double>{1.0, 0.1}, 10);
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::requires_grad());
  OptimizerConfig oc;
  oc.name = OptimizerName::sgd;
  oc.lr = 1.0;
  OptimizerGroupConfig g;
  g.match = {"b"};
  g.lr = 0.1;
  oc.groups = {g};
  auto optimizer = make_optimizer(oc, plan_param_groups(oc, {"a", "b"}, {true, true}, "m"), {a, b});
  s.apply(*optimizer, 5);  // half way: each rate halved
  EXPECT_NEAR(optimizer->param_groups()[0].options().get_lr(), 0.5, 1e-12);
  EXPECT_NEAR(optimizer->param_groups()[1].options().get_lr(), 0.05, 1e-12);
  EXPECT_NEAR(s.lr(5, 1), 0.05, 1e-12);
}

}  // namespace
}  // namespace kiln
