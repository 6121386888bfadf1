// The loops, driven in-process by fakes: no dlopen, no subprocess, no
// process group. Each test pins down one rule of docs/hooks.md or
// docs/checkpoints.md at the level of the loop that owns it.
#include <gtest/gtest.h>

#include "loop_fakes.hpp"

namespace kiln {
namespace {

using namespace kiln::test;

TEST(FitLoopTest, RunsMaxEpochsWithHooksInOrderAndAnEpochCheckpointEachEpoch) {
  Fit fit(2, -1);
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "2/0/6");
  EXPECT_EQ(fit.stop->reason(), StopReason::max_epochs);
  const std::vector<std::string> expected{
      "on_fit_start", "on_train_epoch_start", "on_train_batch_end 1", "on_train_batch_end 2", "on_train_batch_end 3",
      "on_validation_start", "on_validation_end", "on_train_epoch_end", "on_train_epoch_start", "on_train_batch_end 4",
      "on_train_batch_end 5", "on_train_batch_end 6", "on_validation_start", "on_validation_end", "on_train_epoch_end",
      "on_fit_end"};
  EXPECT_EQ(fit.events.seen, expected);
  ASSERT_EQ(fit.control.checkpoints.size(), 2u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "1/0/3");
  EXPECT_EQ(text(fit.control.checkpoints[1]), "2/0/6");
  ASSERT_EQ(fit.control.rows.size(), 2u);
  EXPECT_EQ(fit.control.rows[1].at("epoch"), 1);
  EXPECT_EQ(fit.control.rows[1].at("step"), 6);
  EXPECT_TRUE(fit.control.rows[1].count("train/loss"));
  // One vote per step in a single process, and one at each epoch end.
  EXPECT_EQ(fit.control.votes, 6 + 2);
}

TEST(FitLoopTest, MaxStepsEndsMidEpochWhereAResumedRunContinues) {
  Fit fit(5, 4);
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "1/1/4");
  EXPECT_EQ(fit.stop->reason(), StopReason::max_steps);
  EXPECT_EQ(fit.stop->describe(), "max_steps=4 reached (step 4)");
  // The cut-short epoch is not on the epoch schedule, but the fit's end is
  // committed where it stopped (Lightning's last.ckpt at that epoch's end).
  ASSERT_EQ(fit.control.checkpoints.size(), 2u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "1/0/3");
  EXPECT_EQ(text(fit.control.checkpoints[1]), "1/1/4");
  // A resumed run with a larger max_steps goes on from there, once.
  Fit more(5, 6);
  EXPECT_EQ(text(more.run(TrainPosition{1, 1, 4})), "2/0/6");
  ASSERT_EQ(more.control.checkpoints.size(), 1u);
  EXPECT_EQ(text(more.control.checkpoints[0]), "2/0/6");
}

// A stop inside an epoch commits where it stopped before the epoch's end
// runs: the epoch's metrics still unreduced in the checkpoint, the partial
// row logged after it (a resumed run's loggers cut it away and log the
// whole epoch's row), and no second commit at the fit's end.
TEST(FitLoopTest, AStopInsideAnEpochCommitsBeforeTheEpochsMetricsAreReducedAndItsRowLogged) {
  for (const bool requested : {false, true}) {
    SCOPED_TRACE(requested ? "a callback's request" : "max_steps");
    Fit fit(5, requested ? -1 : 4);
    if (requested)
      fit.events.also = [&](Event e, const kiln_progress& p) {
        if (e == Event::train_batch_end && p.global_step == 4) fit.stop->request("kiln.early_stopping", "patience");
      };
    std::vector<std::string> pending_at_save;
    std::vector<size_t> rows_at_save;
    fit.control.on_save = [&](const TrainPosition&) {
      pending_at_save.push_back(fit.metrics.store.export_pending());
      rows_at_save.push_back(fit.control.rows.size());
    };
    EXPECT_EQ(text(fit.run()), "1/1/4");
    ASSERT_EQ(fit.control.checkpoints.size(), 2u);
    EXPECT_EQ(text(fit.control.checkpoints[1]), "1/1/4");
    EXPECT_NE(pending_at_save[1].find("train/loss"), std::string::npos) << "the epoch's metrics were reduced first";
    EXPECT_EQ(rows_at_save[1], 1u) << "epoch 0's row only: the partial row comes after the commit";
    ASSERT_EQ(fit.control.rows.size(), 2u);
    EXPECT_EQ(fit.control.rows[1].at("step"), 4);
  }
}

// A stop takes effect after an optimizer step, never inside an
// accumulation (its gradients are in no checkpoint).
TEST(FitLoopTest, ARequestInsideAnAccumulationStopsAfterItsStep) {
  Fit fit(5, -1);
  fit.settings.training.accumulate_grad_batches = 2;  // 3 batches: steps after batch 1 and batch 2
  fit.model.on_train = [&](int64_t b) {
    if (b == 0) fit.stop->request("cb", "inside the accumulation");
  };
  EXPECT_EQ(text(fit.run()), "0/2/1");
  std::vector<std::string> trained;
  for (const auto& c : fit.model.calls)
    if (c.rfind("train", 0) == 0) trained.push_back(c);
  EXPECT_EQ(trained, (std::vector<std::string>{"train 0", "train 1"}));
  EXPECT_EQ(fit.stop->reason(), StopReason::requested);
}

// The loop drives the optimizer step through its seam only: a fake
// implementation sees each micro-batch's backward (synchronised at an
// accumulation's end), each step with the global step it makes, and the
// gradients dropped at each epoch's start, and the run trains as the
// replicated one does.
TEST(FitLoopTest, TheOptimizerStepIsASeamAFakeImplementationDrives) {
  struct RecordingStep final : OptimizerStep {
    torch::optim::Optimizer& optimizer;
    std::vector<at::Tensor> params;
    std::vector<std::string> calls;
    RecordingStep(torch::optim::Optimizer& o, std::vector<at::Tensor> p) : optimizer(o), params(std::move(p)) {}
    void before_forward() override { calls.push_back("forward"); }
    void backward(const at::Tensor& loss, bool sync) override {
      calls.push_back(sync ? "backward sync" : "backward");
      loss.backward();
    }
    void step(int64_t global_step) override {
      calls.push_back("step " + std::to_string(global_step));
      at::NoGradGuard no_grad;
      optimizer.step();
      clear_gradients();
    }
    void clear_gradients() override {
      for (auto& p : params)
        if (p.grad().defined()) p.mutable_grad().reset();
    }
  };
  torch::manual_seed(0);
  Fit replicated(2, -1);
  replicated.settings.training.accumulate_grad_batches = 2;  // 3 batches: steps after batch 1 and batch 2
  EXPECT_EQ(text(replicated.run()), "2/0/4");

  torch::manual_seed(0);
  Fit fit(2, -1);
  fit.settings.training.accumulate_grad_batches = 2;
  RecordingStep step(fit.optimizer, fit.trainable);
  fit.other_step = &step;
  EXPECT_EQ(text(fit.run()), "2/0/4");
  const std::vector<std::string> epoch = {"forward", "backward", "forward", "backward sync", "step", "forward",
                                          "backward sync", "step"};
  std::vector<std::string> want;
  int64_t n = 0;
  for (int e = 0; e < 2; ++e)
    for (const std::string& call : epoch) want.push_back(call == "step" ? "step " + std::to_string(++n) : call);
  EXPECT_EQ(step.calls, want);
  // The same weights as the replicated step's, to the bit.
  const auto a = replicated.model.net->parameters(), b = fit.model.net->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
}

// A run resumed at its max_steps takes no step more.
TEST(FitLoopTest, ARunResumedAtItsMaxStepsTakesNoStep) {
  Fit fit(5, 4);
  EXPECT_EQ(text(fit.run(TrainPosition{1, 1, 4})), "1/1/4");
  EXPECT_EQ(fit.stop->reason(), StopReason::max_steps);
  EXPECT_TRUE(fit.model.calls.empty());
  EXPECT_TRUE(fit.control.checkpoints.empty()) << "the position it resumed from is committed already";
}

TEST(FitLoopTest, AFitWhoseLastEpochIsOffTheScheduleCommitsItsEnd) {
  Fit fit(3, -1);
  fit.settings.checkpoint_every_n_epochs = 2;
  EXPECT_EQ(text(fit.run()), "3/0/9");
  ASSERT_EQ(fit.control.checkpoints.size(), 2u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "2/0/6");
  EXPECT_EQ(text(fit.control.checkpoints[1]), "3/0/9");
  // Without checkpoints, nothing.
  Fit off(3, -1);
  off.control.checkpoints_on = false;
  off.settings.checkpoint_every_n_epochs = 0;  // as the host sets it then
  off.run();
  EXPECT_TRUE(off.control.checkpoints.empty());
}

TEST(FitLoopTest, AResumedRunContinuesMidEpochWithTheBatchesItHadNotRun) {
  Fit fit(2, -1);
  const TrainPosition end = fit.run(TrainPosition{1, 1, 4});
  EXPECT_EQ(text(end), "2/0/6");
  const std::vector<std::string> trained{"train 1", "train 2"};
  std::vector<std::string> train_calls;
  for (const auto& c : fit.model.calls)
    if (c.rfind("train", 0) == 0) train_calls.push_back(c);
  EXPECT_EQ(train_calls, trained);
  EXPECT_EQ(fit.data.opened.front(), "train epoch 1 from 1");
}

TEST(FitLoopTest, AResumedRunThatHadFinishedRunsNoEpoch) {
  Fit fit(2, -1);
  const TrainPosition end = fit.run(TrainPosition{2, 0, 6});
  EXPECT_EQ(text(end), "2/0/6");
  EXPECT_EQ(fit.stop->reason(), StopReason::max_epochs);
  EXPECT_TRUE(fit.model.calls.empty());
  EXPECT_TRUE(fit.control.checkpoints.empty()) << "the position it resumed from is committed already";
}

TEST(FitLoopTest, ACallbacksRequestStopsAtTheNextStepInOneProcess) {
  Fit fit(5, -1);
  fit.events.also = [&](Event e, const kiln_progress& p) {
    if (e == Event::train_batch_end && p.global_step == 2) fit.stop->request("kiln.early_stopping", "patience");
  };
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "0/2/2");
  EXPECT_EQ(fit.stop->reason(), StopReason::requested);
  EXPECT_NE(fit.stop->describe().find("kiln.early_stopping"), std::string::npos);
}

TEST(FitLoopTest, RanksVoteEveryNStepsSoARequestWaitsForTheVote) {
  Fit fit(5, -1, /*world_size=*/2, /*vote_every=*/2);
  fit.settings.training.spec.batch_size = 2;  // 5 batches an epoch
  fit.events.also = [&](Event e, const kiln_progress& p) {
    if (e == Event::train_batch_end && p.global_step == 1) fit.stop->request("cb", "now");
  };
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "0/2/2");  // asked after step 1, stopped at the vote of step 2
  EXPECT_EQ(fit.stop->reason(), StopReason::requested);
}

TEST(FitLoopTest, AnotherRanksRequestIsAnAgreedStop) {
  Fit fit(5, -1, 2, 1);
  fit.control.others_stop_at_vote = 2;
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "0/2/2");
  EXPECT_EQ(fit.stop->reason(), StopReason::agreed);
}

TEST(FitLoopTest, PreemptionCommitsACheckpointWhereTheVoteWasTakenThenEndsTheRun) {
  Fit fit(5, -1);
  fit.control.preempt_at_vote = 2;
  try {
    fit.run();
    FAIL() << "a preemption must end the run";
  } catch (const RunAborted& e) {
    EXPECT_EQ(e.reason(), KILN_FAILURE_PREEMPTED);
  }
  ASSERT_EQ(fit.control.checkpoints.size(), 1u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "0/2/2");
  EXPECT_EQ(fit.stop->reason(), StopReason::preempted);
}

TEST(FitLoopTest, GradientAccumulationStepsAtBoundariesAndAtTheEpochsLastBatch) {
  Fit fit(1, -1);
  fit.settings.training.accumulate_grad_batches = 2;  // 3 batches: steps after batch 1 and batch 2
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "1/0/2");
}

// In one process the gradients are dropped after each optimizer step, not
// zeroed (PyTorch 2's set_to_none; LibTorch 1.13's zero_grad() zeroes):
// the next backward writes them instead of adding to zeros. Accumulation
// still adds up inside a step.
TEST(FitLoopTest, InOneProcessGradientsAreDroppedAfterEachOptimizerStep) {
  Fit fit(1, -1);
  fit.model.has_val = fit.model.has_test = false;
  fit.settings.training.accumulate_grad_batches = 2;
  int steps = 0;
  fit.events.also = [&](Event event, const kiln_progress&) {
    if (event != Event::train_batch_end) return;
    ++steps;
    for (const auto& p : fit.trainable) EXPECT_FALSE(p.grad().defined()) << "after step " << steps;
  };
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "1/0/2");
  EXPECT_EQ(steps, 2);
}

// kiln's optimizers are LibTorch's own, whose step() builds no graph (it
// runs under its NoGradGuard): the loop steps them below the dispatcher's
// autograd layer, which only passed each op on (~0.1 us an op). The same
// kernels run, and the version counters still move, so a graph that saved a
// weight before the step refuses to backward through it, as it would have.
TEST(FitLoopTest, TheOptimizerStepRunsBelowTheAutogradLayerAndKeepsVersionCounters) {
  Fit fit(1, -1);
  fit.model.has_val = fit.model.has_test = false;
  // Adam: LibTorch 1.13's SGD updates p.data(), which moves no counter.
  struct Probe final : torch::optim::Adam {
    using Adam::Adam;
    int steps = 0, below_autograd = 0, grad_mode = 0;
    at::Tensor step(LossClosure closure = nullptr) override {
      ++steps;
      below_autograd += c10::impl::tls_is_dispatch_keyset_excluded(c10::autograd_dispatch_keyset);
      grad_mode += at::GradMode::is_enabled();
      return Adam::step(std::move(closure));
    }
  } probe(fit.trainable, torch::optim::AdamOptions(0.1));
  fit.other_optimizer = &probe;
  const at::Tensor weight = fit.model.net->weight;
  const at::Tensor saved = (weight * weight).sum();  // saves the weight for its backward
  const int64_t version_before = weight._version();
  const at::Tensor weight_before = weight.detach().clone();
  fit.run();
  EXPECT_EQ(probe.steps, 3);
  EXPECT_EQ(probe.below_autograd, 3) << "each step below the autograd layer";
  EXPECT_EQ(probe.grad_mode, 0);
  EXPECT_GE(weight._version(), version_before + 3) << "every in-place update counted";
  EXPECT_FALSE(weight.detach().equal(weight_before));
  EXPECT_FALSE(weight.requires_grad() && weight.grad_fn()) << "the weight is still a leaf";
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_THROW(saved.backward(), c10::Error) << "the graph sees the weight was modified";
  // Outside the step the loop is back above it: the next forward records.
  EXPECT_FALSE(c10::impl::tls_is_dispatch_keyset_excluded(c10::autograd_dispatch_keyset));
}

// Issue 9's rule: nothing in the training step waits for the device. The
// loss is recorded as a tensor and copied to the host once per log point
// (here: each epoch end), with gradient-norm clipping and accumulation on;
// no item() anywhere (LibTorch's clip_grad_norm_ would be one per step).
TEST(FitLoopTest, TheTrainingStepReadsNothingBackFromTheDevice) {
  Fit fit(3, -1);
  fit.model.has_val = fit.model.has_test = false;
  fit.metrics.on_device.emplace(/*defer_cpu=*/true);
  fit.clipping.value = 0.5;
  fit.settings.training.accumulate_grad_batches = 2;
  // Collected rows (ABI 1.2's collect) are copied without a read-back too.
  FakeCollector collector;
  fit.context.collector = &collector;
  fit.model.collect_into = &collector.collection;
  // trainer.detect_nonfinite on (its default): still nothing read per step.
  NonfiniteWatch watch(NonfiniteMode::raise, /*check_every=*/50);
  fit.nonfinite = &watch;
  HostReads reads;
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "3/0/6");
  EXPECT_EQ(reads.count(), 0) << "no item() anywhere in the loop";
  EXPECT_EQ(watch.reads(), 3) << "one copy of the non-finite check per epoch end (a log point), none per step";
  EXPECT_EQ(collector.rows_per_epoch, (std::vector<int64_t>{10, 10, 10})) << "every epoch's rows, merged";
  EXPECT_EQ(fit.metrics.on_device->device_reads(), 3) << "one copy of the pending metrics per epoch end, none per step";
  ASSERT_EQ(fit.control.rows.size(), 3u);
  EXPECT_GT(fit.control.rows[0].at("train/loss"), 0.0);
}

// 16-mixed's one exception, as PyTorch's GradScaler: one flag read per
// optimizer step decides whether the step is skipped.
TEST(FitLoopTest, Float16MixedReadsOneFlagPerOptimizerStep) {
  Fit fit(1, -1);
  fit.model.has_val = fit.model.has_test = false;
  fit.metrics.on_device.emplace(/*defer_cpu=*/true);
  ScalerState state;
  GradScaler scaler(state);
  fit.scaler = &scaler;
  HostReads reads;
  fit.run();
  EXPECT_EQ(reads.count(), 3) << "one flag per step";
  EXPECT_EQ(fit.metrics.on_device->device_reads(), 1) << "one copy of the metrics at the epoch end";
  EXPECT_EQ(state.skipped, 0);
  EXPECT_EQ(state.growth_tracker, 3);
}

TEST(FitLoopTest, StepCheckpointsFollowEveryNSteps) {
  Fit fit(1, -1);
  fit.settings.checkpoint_every_n_epochs = 0;
  fit.settings.training.checkpoint_every_n_steps = 2;
  fit.run();
  ASSERT_EQ(fit.control.checkpoints.size(), 2u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "0/2/2");
  EXPECT_EQ(text(fit.control.checkpoints[1]), "1/0/3") << "the fit's end";
}

TEST(FitLoopTest, TestAfterFitRunsTheTestSplitOnceWithItsOwnRow) {
  Fit fit(1, -1);
  fit.settings.test_after_fit = true;
  fit.run();
  EXPECT_EQ(fit.events.seen.back(), "on_test_end");
  ASSERT_EQ(fit.control.rows.size(), 2u);
  EXPECT_EQ(fit.control.rows[1].at("epoch"), 0);
}

// --- max_time -----------------------------------------------------------------

TEST(FitLoopTest, MaxTimeStopsAtTheNextStepWithACheckpointToResumeFrom) {
  Fit fit(5, -1);
  fit.settings.checkpoint_every_n_epochs = 0;
  fit.stop = std::make_unique<StopCondition>(5, -1, 1, /*max_seconds=*/0);  // out of time at once
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "0/1/1");
  EXPECT_EQ(fit.stop->reason(), StopReason::max_time);
  EXPECT_EQ(fit.stop->describe(), "max_time=00:00:00 reached (step 1)");
  ASSERT_EQ(fit.control.checkpoints.size(), 1u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "0/1/1");
}

TEST(FitLoopTest, MaxTimeWithoutCheckpointsStopsWithoutOne) {
  Fit fit(5, -1);
  fit.control.checkpoints_on = false;
  fit.settings.checkpoint_every_n_epochs = 0;
  fit.stop = std::make_unique<StopCondition>(5, -1, 1, 0);
  EXPECT_EQ(text(fit.run()), "0/1/1");
  EXPECT_TRUE(fit.control.checkpoints.empty());
}

TEST(FitLoopTest, MaxTimeOnAStepThatCheckpointsAnywaySavesOnce) {
  Fit fit(5, -1);
  fit.settings.checkpoint_every_n_epochs = 0;
  fit.settings.training.checkpoint_every_n_steps = 1;
  fit.stop = std::make_unique<StopCondition>(5, -1, 1, 0);
  fit.run();
  ASSERT_EQ(fit.control.checkpoints.size(), 1u);
}

TEST(FitLoopTest, AnotherRankOutOfTimeStopsEveryRankAtTheSameVote) {
  Fit fit(5, -1, /*world_size=*/2, /*vote_every=*/2);
  fit.settings.training.spec.batch_size = 2;  // 5 batches an epoch
  fit.settings.checkpoint_every_n_epochs = 0;
  fit.stop = std::make_unique<StopCondition>(5, -1, 2, /*max_seconds=*/3600);  // this rank has time
  fit.control.others_out_of_time_at_vote = 2;                                 // the other has not
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "0/4/4");  // votes at steps 2 and 4
  EXPECT_EQ(fit.stop->reason(), StopReason::max_time);
  ASSERT_EQ(fit.control.checkpoints.size(), 1u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "0/4/4");
}

TEST(FitLoopTest, TimeLeftChangesNothing) {
  Fit fit(2, -1);
  fit.stop = std::make_unique<StopCondition>(2, -1, 1, 3600);
  EXPECT_EQ(text(fit.run()), "2/0/6");
  EXPECT_EQ(fit.stop->reason(), StopReason::max_epochs);
}

// --- val_check_interval ----------------------------------------------------------

std::vector<std::string> calls_of(const Fit& fit, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& c : fit.model.calls)
    if (c.rfind(prefix, 0) == 0) out.push_back(c);
  return out;
}

TEST(FitLoopTest, ValCheckIntervalValidatesInsideTheEpochAndAtItsEnd) {
  Fit fit(1, -1);
  fit.settings.training.spec.batch_size = 2;  // 5 batches
  fit.settings.val_check_interval = BatchLimit{false, 0.0, 2};
  fit.run();
  // After batches 1 and 3, then at the epoch's end.
  EXPECT_EQ(calls_of(fit, "val 0").size(), 3u);
  std::vector<std::string> order;
  for (const auto& c : fit.model.calls)
    if (c == "val 0" || c.rfind("train", 0) == 0) order.push_back(c);
  EXPECT_EQ(order, (std::vector<std::string>{"train 0", "train 1", "val 0", "train 2", "train 3", "val 0", "train 4",
                                             "val 0"}));
  // A row per mid-epoch validation at its step, then the epoch's.
  ASSERT_EQ(fit.control.rows.size(), 3u);
  EXPECT_EQ(fit.control.rows[0].at("step"), 2);
  EXPECT_EQ(fit.control.rows[1].at("step"), 4);
  EXPECT_EQ(fit.control.rows[2].at("step"), 5);
}

TEST(FitLoopTest, AFractionalValCheckIntervalCountsTheEpochsBatches) {
  Fit fit(1, -1);
  fit.settings.training.spec.batch_size = 1;  // 10 batches
  fit.settings.val_check_interval = BatchLimit{true, 0.25, 0};  // every 2 batches
  fit.run();
  EXPECT_EQ(fit.control.rows.size(), 5u);  // after batches 1, 3, 5, 7 and the end
}

TEST(FitLoopTest, AValidationInsideTheEpochLeavesTheEpochsTrainingMetricsWhole) {
  torch::manual_seed(7);  // the same initial weights for both
  Fit plain(1, -1);
  plain.settings.training.spec.batch_size = 2;
  plain.run();
  torch::manual_seed(7);
  Fit mid(1, -1);
  mid.settings.training.spec.batch_size = 2;
  mid.settings.val_check_interval = BatchLimit{false, 0.0, 2};
  mid.run();
  ASSERT_TRUE(plain.control.rows.back().count("train/loss"));
  ASSERT_TRUE(mid.control.rows.back().count("train/loss"));
  EXPECT_EQ(mid.control.rows.back().at("train/loss"), plain.control.rows.back().at("train/loss"));
  EXPECT_FALSE(mid.control.rows.front().count("train/loss"));  // the validation's row is the validation's
}

TEST(FitLoopTest, AResumedEpochValidatesWhereTheFirstRunWould) {
  Fit fit(1, -1);
  fit.settings.training.spec.batch_size = 2;  // 5 batches
  fit.settings.val_check_interval = BatchLimit{false, 0.0, 2};
  fit.run(TrainPosition{0, 3, 3});  // resumed after batch 2
  std::vector<std::string> order;
  for (const auto& c : fit.model.calls)
    if (c == "val 0" || c.rfind("train", 0) == 0) order.push_back(c);
  EXPECT_EQ(order, (std::vector<std::string>{"train 3", "val 0", "train 4", "val 0"}));
}

TEST(FitLoopTest, EpochsThatDoNotValidateDoNotValidateInside) {
  Fit fit(2, -1);
  fit.settings.check_val_every_n_epoch = 2;
  fit.settings.training.spec.batch_size = 2;
  fit.settings.val_check_interval = BatchLimit{false, 0.0, 2};
  fit.run();
  EXPECT_EQ(fit.control.rows.size(), 4u);  // epoch 0's row; epoch 1: two inside, one at the end
}

class EvaluationLoopTest : public ::testing::TestWithParam<kiln_split> {};

TEST_P(EvaluationLoopTest, RunsEveryBatchOfItsSplitAndTellsTheCallbacks) {
  const kiln_split split = GetParam();
  Fit fit(1, -1);
  const auto metrics = EvaluationLoop(fit.context, split, EpochSpec{false, 4, BatchLimit{}}, true).run();
  const std::string name = split_name(split);
  const std::vector<std::string> steps{name + " 0", name + " 1"};
  EXPECT_EQ(fit.model.calls, steps);
  const std::vector<std::string> events =
      split == KILN_SPLIT_VAL ? std::vector<std::string>{"on_validation_start", "on_validation_end"}
                              : std::vector<std::string>{"on_test_end"};
  EXPECT_EQ(fit.events.seen, events);
  EXPECT_EQ(fit.control.rows.size(), 1u);  // standalone: one metrics.csv row
}

TEST_P(EvaluationLoopTest, AnEmptySplitIsRefused) {
  Fit fit(1, -1);
  fit.data.lengths[GetParam()] = 0;
  EXPECT_THROW(EvaluationLoop(fit.context, GetParam(), EpochSpec{false, 4, BatchLimit{}}, true).run(), std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(Splits, EvaluationLoopTest, ::testing::Values(KILN_SPLIT_VAL, KILN_SPLIT_TEST),
                         [](const auto& info) { return std::string(split_name(info.param)); });

TEST(PredictLoopTest, GathersEveryRowInOrder) {
  Fit fit(1, -1);
  const auto outputs = PredictLoop(fit.context, EpochSpec{false, 3, BatchLimit{}}).run();
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(torch::cat(outputs).size(0), 7);
}

TEST(StopConditionTest, TheFirstReasonIsTheOneKept) {
  FakeControl control;
  StopCondition stop(2, 3, 1);
  EXPECT_FALSE(stop.after_step(control, 1));
  stop.request("a", "first");
  stop.request("b", "second");
  EXPECT_EQ(stop.after_step(control, 3), StopReason::requested);  // max_steps also holds: the vote comes first
  EXPECT_EQ(stop.after_epoch(control, 2, 3), StopReason::requested);
  EXPECT_EQ(stop.reason(), StopReason::requested);
  EXPECT_NE(stop.describe().find("'a': first"), std::string::npos);
}

}  // namespace
}  // namespace kiln

namespace kiln::test {
namespace {

// Lightning's sanity check: after on_fit_start, N validation batches before
// the first training batch, with no callback event and nothing recorded.
TEST(FitLoopTest, TheSanityCheckRunsItsValidationBatchesFirstAndRecordsNothing) {
  Fit fit(1, -1);
  fit.settings.sanity_val_steps = 1;
  fit.model.has_test = false;
  fit.run();
  ASSERT_GE(fit.model.calls.size(), 3u);
  EXPECT_EQ(fit.model.calls[0], "val 0");
  EXPECT_EQ(fit.model.calls[1], "train 0") << "one batch, then training";
  EXPECT_EQ(fit.events.seen.front(), "on_fit_start");
  EXPECT_EQ(fit.events.seen[1], "on_train_epoch_start") << "no validation events for the sanity check";
  EXPECT_EQ(fit.data.opened.front(), "val epoch 0 from 0");

  Fit all(1, -1);
  all.settings.sanity_val_steps = -1;
  all.model.has_test = false;
  all.run();
  EXPECT_EQ(std::vector<std::string>(all.model.calls.begin(), all.model.calls.begin() + 3),
            (std::vector<std::string>{"val 0", "val 1", "train 0"}))
      << "-1: the whole split (6 rows, batches of 4)";
}

}  // namespace
}  // namespace kiln::test
