// optim/weight_averaging: the EMA against its closed form, SWA's running
// mean, the swap around an evaluation, and the checkpointed state.
#include <gtest/gtest.h>

#include <cmath>

#include <ATen/ATen.h>

#include "optim/weight_averaging.hpp"

namespace kiln {
namespace {

// A "model" of one parameter and two buffers (one float, one counter),
// driven through known weights w_1..w_T.
struct Tiny {
  NamedTensors params{{"w", at::zeros({3}, at::kDouble)}};
  NamedTensors buffers{{"running_mean", at::zeros({2}, at::kDouble)}, {"count", at::zeros({1}, at::kLong)}};
  void set(double value) {
    params[0].second.fill_(value);
    buffers[0].second.fill_(-value);
    buffers[1].second.fill_(static_cast<int64_t>(value));
  }
};

double weights_at(int t) { return std::sin(0.7 * t) + 0.1 * t; }

TEST(WeightAveraging, EmaIsTheClosedFormAverage) {
  AveragingConfig config;
  config.kind = AveragingKind::ema;
  config.decay = 0.8;
  config.start_step = 3;  // steps 1..3: the average is the weights
  Tiny tiny;
  tiny.set(weights_at(0));
  WeightAveraging ema(config, 10, tiny.params, tiny.buffers);
  const int T = 12;
  for (int t = 1; t <= T; ++t) {
    tiny.set(weights_at(t));
    ema.after_step(t);
  }
  // avg_T = d^(T-s) w_s + sum_{t=s+1..T} (1 - d) d^(T-t) w_t, s = start_step.
  const int s = 3;
  const double d = config.decay;
  double expected = std::pow(d, T - s) * weights_at(s);
  for (int t = s + 1; t <= T; ++t) expected += (1 - d) * std::pow(d, T - t) * weights_at(t);
  ASSERT_EQ(ema.state().tensors.size(), 2u) << "the parameter and the float buffer; the counter is the model's";
  EXPECT_EQ(ema.state().tensors[0].first, "param/w");
  EXPECT_EQ(ema.state().tensors[1].first, "buffer/running_mean");
  EXPECT_NEAR(ema.state().tensors[0].second[0].item<double>(), expected, 1e-12);
  EXPECT_NEAR(ema.state().tensors[1].second[1].item<double>(), -expected, 1e-12);
  EXPECT_EQ(ema.state().count, T - s);

  // Swapped in for an evaluation, then back; for good at the end.
  {
    WeightAveraging::InModel averaged(&ema);
    EXPECT_NEAR(tiny.params[0].second[2].item<double>(), expected, 1e-12);
    EXPECT_EQ(tiny.buffers[1].second[0].item<int64_t>(), static_cast<int64_t>(weights_at(T)));
  }
  EXPECT_EQ(tiny.params[0].second[2].item<double>(), weights_at(T));
  ema.copy_into_model();
  EXPECT_NEAR(tiny.params[0].second[0].item<double>(), expected, 1e-12);
}

TEST(WeightAveraging, SwaIsTheMeanOfTheEpochEndsFromItsStart) {
  AveragingConfig config;
  config.kind = AveragingKind::swa;
  config.start_epoch = BatchLimit{true, 0.5, 0};  // of 6 epochs: from epoch 3
  Tiny tiny;
  WeightAveraging swa(config, 6, tiny.params, tiny.buffers);
  EXPECT_FALSE(swa.ready());
  double sum = 0;
  for (int epoch = 0; epoch < 6; ++epoch) {
    tiny.set(weights_at(epoch));
    swa.after_step(epoch + 1);  // EMA's hook: nothing for SWA
    swa.after_epoch(epoch);
    if (epoch >= 3) sum += weights_at(epoch);
  }
  EXPECT_TRUE(swa.ready());
  EXPECT_EQ(swa.state().count, 3);
  EXPECT_NEAR(swa.state().tensors[0].second[0].item<double>(), sum / 3, 1e-12);
}

TEST(WeightAveraging, SwaBeforeItsStartLeavesEvaluationsTheWeights) {
  AveragingConfig config;
  config.kind = AveragingKind::swa;
  config.start_epoch = BatchLimit{false, 1.0, 2};
  Tiny tiny;
  tiny.set(1.0);
  WeightAveraging swa(config, 4, tiny.params, tiny.buffers);
  tiny.set(5.0);
  swa.after_epoch(0);
  {
    WeightAveraging::InModel averaged(&swa);
    EXPECT_EQ(tiny.params[0].second[0].item<double>(), 5.0) << "no average yet: the weights";
  }
  swa.copy_into_model();
  EXPECT_EQ(tiny.params[0].second[0].item<double>(), 5.0);
  EXPECT_EQ(swa.never_updated(0, 10),
            "SWA averaged no epoch's end (it starts at epoch 2, the fit ended in epoch 0)");
}

// An EMA whose start step the fit never passed holds the weights, not an
// average: the fit's end says so (as for SWA), and says nothing once it
// has been updated.
TEST(WeightAveraging, AnEmaBeforeItsStartStepSaysItWasNeverUpdated) {
  AveragingConfig config;
  config.kind = AveragingKind::ema;
  config.decay = 0.5;
  config.start_step = 3;
  Tiny tiny;
  WeightAveraging ema(config, 4, tiny.params, tiny.buffers);
  for (int64_t step = 1; step <= 3; ++step) {
    tiny.set(static_cast<double>(step));
    ema.after_step(step);
  }
  EXPECT_EQ(ema.never_updated(0, 3), "the EMA was never updated (it starts after step 3, the fit ended at step 3)");
  ema.after_step(4);
  EXPECT_EQ(ema.never_updated(0, 4), "");
}

}  // namespace
}  // namespace kiln
