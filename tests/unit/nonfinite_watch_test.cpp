// optim/nonfinite_watch: a NaN/inf loss or gradient norm found at the log
// points, named by its window, without a read of the device per step.
#include <gtest/gtest.h>

#include <limits>

#include <ATen/ATen.h>

#include "loop_fakes.hpp"
#include "optim/nonfinite_watch.hpp"

namespace kiln {
namespace {

using test::HostReads;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Steps 1..n with loss `loss(step)`, the watch told after each.
void steps(NonfiniteWatch& watch, int from, int to, const std::function<double(int)>& loss, int64_t epoch = 0) {
  for (int s = from; s <= to; ++s) {
    watch.add_loss(at::tensor(loss(s), at::kFloat));
    watch.after_step(s, epoch);
  }
}

TEST(NonfiniteWatch, FiniteLossesPassAndNothingIsReadBetweenLogPoints) {
  NonfiniteWatch watch(NonfiniteMode::raise, 10);
  HostReads reads;
  steps(watch, 1, 25, [](int s) { return 1e30 * s; });  // huge is not infinite
  EXPECT_EQ(reads.count(), 0);
  EXPECT_EQ(watch.reads(), 2) << "steps 10 and 20";
}

TEST(NonfiniteWatch, RaiseNamesTheWindowOfTheFirstBadLoss) {
  NonfiniteWatch watch(NonfiniteMode::raise, 50);
  watch.start(3100);
  try {
    steps(watch, 3101, 3200, [](int s) { return s >= 3163 ? kNaN : 0.5; }, 7);
    FAIL() << "no error";
  } catch (const NonfiniteTraining& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.detect_nonfinite: the training loss became NaN or inf between step "
                                         "3150 and 3200 (epoch 7)"),
              std::string::npos)
        << e.what();
  }
}

TEST(NonfiniteWatch, InfAndGradientNormsCountTooAndOneStepWindowsAreExact) {
  NonfiniteWatch watch(NonfiniteMode::raise, 1);
  steps(watch, 1, 4, [](int) { return 1.0; });
  watch.add_loss(at::tensor(-kInf, at::kFloat));
  EXPECT_THROW(watch.after_step(5, 0), NonfiniteTraining);

  NonfiniteWatch grads(NonfiniteMode::raise, 1);
  grads.add_loss(at::tensor(1.0, at::kFloat));
  grads.add_grad_norm(at::tensor(kInf, at::kFloat));
  try {
    grads.after_step(1, 0);
    FAIL() << "no error";
  } catch (const NonfiniteTraining& e) {
    EXPECT_NE(std::string(e.what()).find("the gradient norm became NaN or inf at step 1"), std::string::npos)
        << e.what();
  }
}

TEST(NonfiniteWatch, WarnTrainsOnAndOffDoesNotLook) {
  NonfiniteWatch warn(NonfiniteMode::warn, 2);
  EXPECT_NO_THROW(steps(warn, 1, 10, [](int) { return kNaN; }));
  NonfiniteWatch off(NonfiniteMode::off, 2);
  EXPECT_NO_THROW(steps(off, 1, 10, [](int) { return kNaN; }));
  EXPECT_EQ(off.reads(), 0);
  EXPECT_TRUE(off.may_commit({at::full({2}, kNaN)}, 10, 0)) << "off: no check at all";
}

TEST(NonfiniteWatch, NoCheckpointOfNonfiniteWeights) {
  const std::vector<at::Tensor> good{at::ones({3}), at::zeros({2}, at::kLong)};
  const std::vector<at::Tensor> bad{at::ones({3}), at::tensor({1.0, kNaN})};
  NonfiniteWatch warn(NonfiniteMode::warn, 100);
  EXPECT_TRUE(warn.may_commit(good, 5, 0));
  EXPECT_FALSE(warn.may_commit(bad, 6, 0));
  NonfiniteWatch raise(NonfiniteMode::raise, 100);
  EXPECT_TRUE(raise.may_commit(good, 5, 0));
  EXPECT_THROW(raise.may_commit(bad, 6, 0), NonfiniteTraining);
}

TEST(NonfiniteWatch, TheRanksFindingsAreSummed) {
  int calls = 0;
  // Another rank found a bad loss: this one must stop too.
  NonfiniteWatch watch(NonfiniteMode::raise, 4, [&calls](at::Tensor& found) {
    ++calls;
    found[0] += 1.0;
  });
  try {
    steps(watch, 1, 4, [](int) { return 1.0; });
    FAIL() << "no error";
  } catch (const NonfiniteTraining& e) {
    EXPECT_NE(std::string(e.what()).find("between step 0 and 4 (epoch 0) on 1 rank(s)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace kiln
