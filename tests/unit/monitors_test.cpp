// train/monitors: learning rates read from the optimizer's param_groups()
// (one group or several), step rows every log_every_n_steps steps, and the
// timings taken from the clock the test hands in.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "train/monitors.hpp"

namespace kiln {
namespace {

using Clock = TrainingMonitors::Clock;
using std::chrono::milliseconds;

TEST(Monitors, NameTheLearningRatesAsLightningsLearningRateMonitorDoes) {
  at::Tensor w = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  torch::optim::AdamW adamw({w}, torch::optim::AdamWOptions(0.1));
  EXPECT_EQ(optimizer_class_name(sgd), "SGD");
  EXPECT_EQ(optimizer_class_name(adam), "Adam");
  EXPECT_EQ(optimizer_class_name(adamw), "AdamW");
  EXPECT_EQ(learning_rate_name("SGD", 0, 1), "lr-SGD");
  EXPECT_EQ(learning_rate_name("SGD", 0, 2), "lr-SGD/pg1");
  EXPECT_EQ(learning_rate_name("SGD", 1, 2), "lr-SGD/pg2");
}

TEST(Monitors, LogEachParameterGroupsRateTheStepUsedAndTheTimings) {
  at::Tensor a = torch::zeros({2}, torch::requires_grad());
  at::Tensor b = torch::zeros({3}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<torch::optim::SGDOptions>(0.1));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::SGDOptions>(0.01));
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.5));

  TrainingMonitors monitors(/*log_every_n_steps=*/2, /*world_size=*/2);
  monitors.attach(sgd);
  const Clock::time_point t0{};
  monitors.on_epoch_start(t0);
  // Step 1: 8 rows on this rank (16 over both), 10 ms; a per-step schedule
  // halves the rates after the optimizer step, before train_batch_end.
  monitors.on_batch(torch::tensor(0.75), 8);
  for (auto& g : sgd.param_groups()) g.options().set_lr(g.options().get_lr() / 2);
  EXPECT_FALSE(monitors.on_step_end(1, t0 + milliseconds(10)));
  // Step 2: two accumulated batches, 30 ms: a step row (2 % 2 == 0).
  monitors.on_batch(torch::tensor(0.5), 8);
  monitors.on_batch(torch::tensor(0.25), 8);
  const auto row = monitors.on_step_end(2, t0 + milliseconds(40));
  ASSERT_TRUE(row);
  EXPECT_DOUBLE_EQ(row->at("train/loss_step"), 0.25);  // the step's last batch
  EXPECT_DOUBLE_EQ(row->at("lr-SGD/pg1_step"), 0.05);  // what step 2 used
  EXPECT_DOUBLE_EQ(row->at("lr-SGD/pg2_step"), 0.005);
  EXPECT_DOUBLE_EQ(row->at("train/samples_per_sec_step"), 48 / 0.040);
  EXPECT_DOUBLE_EQ(row->at("train/step_time_step"), 0.020);
  EXPECT_EQ(row->size(), 5u);

  // Validation inside the epoch (500 ms) is left out of the timings.
  monitors.on_validation_start(t0 + milliseconds(45));
  monitors.on_validation_end(t0 + milliseconds(545));
  monitors.on_batch(torch::tensor(0.125), 4);  // step 3: a short last batch, 20 ms of training
  EXPECT_FALSE(monitors.on_step_end(3, t0 + milliseconds(560)));
  const auto epoch = monitors.epoch_values();
  EXPECT_DOUBLE_EQ(epoch.at("lr-SGD/pg1"), 0.05);
  EXPECT_DOUBLE_EQ(epoch.at("lr-SGD/pg2"), 0.005);
  EXPECT_DOUBLE_EQ(epoch.at("train/samples_per_sec"), 56 / 0.060);
  EXPECT_DOUBLE_EQ(epoch.at("train/step_time"), 0.020);
  EXPECT_EQ(epoch.size(), 4u);
}

TEST(Monitors, AnEpochWithoutStepsReportsTheRateInForceAndNoTimings) {
  at::Tensor w = torch::zeros({2}, torch::requires_grad());
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.003));
  TrainingMonitors monitors(50, 1);
  monitors.attach(adam);
  monitors.on_epoch_start();
  const auto epoch = monitors.epoch_values();
  EXPECT_EQ(epoch, (std::map<std::string, double>{{"lr-Adam", 0.003}}));
}

}  // namespace
}  // namespace kiln
