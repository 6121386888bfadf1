// The loops, driven in-process by fakes: no dlopen, no subprocess, no
// process group. Each test pins down one rule of docs/hooks.md or
// docs/checkpoints.md at the level of the loop that owns it.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "plugin/host_objects.hpp"
#include "train/loops/evaluation_loop.hpp"
#include "train/loops/fit_loop.hpp"
#include "train/loops/predict_loop.hpp"
#include "train/loops/stop_condition.hpp"
#include "train/optim.hpp"
#include "train/progress.hpp"
#include "train/session.hpp"
#include "metrics/metric_store.hpp"

namespace kiln {
namespace {

// A linear model; every call is written down.
struct FakeModel final : StepModel {
  torch::nn::Linear net{4, 1};
  std::vector<std::string> calls;
  bool has_val = true, has_test = true;

  bool has_step(kiln_split split) const override {
    return split == KILN_SPLIT_VAL ? has_val : split == KILN_SPLIT_TEST ? has_test : true;
  }
  at::Tensor training_step(kiln_batch& batch, int64_t b) override {
    calls.push_back("train " + std::to_string(b));
    return net->forward(batch.tensors[0].second).pow(2).mean();
  }
  void evaluation_step(kiln_split split, kiln_batch&, int64_t b) override {
    calls.push_back(std::string(split_name(split)) + " " + std::to_string(b));
  }
  at::Tensor predict_step(kiln_batch& batch, int64_t b) override {
    calls.push_back("predict " + std::to_string(b));
    return net->forward(batch.tensors[0].second);
  }
};

// Splits of `length` rows, read in order, `batch_size` rows a batch; the
// batch's first value is its epoch, so a test can see which epoch it was.
struct FakeData final : BatchSource {
  std::map<kiln_split, int64_t> lengths{{KILN_SPLIT_TRAIN, 10}, {KILN_SPLIT_VAL, 6}, {KILN_SPLIT_TEST, 5},
                                        {KILN_SPLIT_PREDICT, 7}};
  std::vector<std::string> opened;

  struct Stream final : BatchStream {
    int64_t rows_left, batch_size, left;
    Stream(int64_t rows, int64_t bs, int64_t batches) : rows_left(rows), batch_size(bs), left(batches) {}
    int64_t size() const override { return left; }
    BatchPtr next() override {
      const int64_t rows = std::min(batch_size, rows_left);
      rows_left -= rows;
      --left;
      BatchPtr batch(new kiln_batch);
      batch->tensors.emplace_back("x", torch::ones({rows, 4}));
      return batch;
    }
  };

  int64_t length(kiln_split split) override { return lengths[split]; }
  int64_t batches_per_epoch(kiln_split split, const EpochSpec& spec) override {
    return spec.limit.apply((lengths[split] + spec.batch_size - 1) / spec.batch_size);
  }
  std::unique_ptr<BatchStream> open(kiln_split split, const EpochSpec& spec, int64_t epoch, int64_t first) override {
    opened.push_back(std::string(split_name(split)) + " epoch " + std::to_string(epoch) + " from " + std::to_string(first));
    const int64_t batches = batches_per_epoch(split, spec);
    return std::make_unique<Stream>(lengths[split] - first * spec.batch_size, spec.batch_size, batches - first);
  }
  [[noreturn]] void refuse_empty(kiln_split, const std::string& message) override { throw std::runtime_error(message); }
};

struct FakeEvents final : EventSink {
  std::vector<std::string> seen;
  std::function<void(Event, const kiln_progress&)> also;
  void notify(Event event, const kiln_progress& p) override {
    if (event != Event::train_batch_end) seen.push_back(event_name(event));
    else seen.push_back(std::string(event_name(event)) + " " + std::to_string(p.global_step));
    if (also) also(event, p);
  }
};

struct FakeMetrics final : MetricSink {
  MetricStore store;
  void record(const char* name, double value, double weight, uint32_t flags) override {
    store.record(name, value, weight, flags);
  }
  void record_loss(const at::Tensor& loss, double weight) override {
    record("train/loss", loss.item<double>(), weight, KILN_METRIC_REDUCE_MEAN);
  }
  std::map<std::string, double> reduce() override { return store.reduce(); }
};

// Votes as other ranks would answer them: `others_stop_at_vote` N means
// another rank asks to stop at the Nth vote; `preempt_at_vote` likewise.
struct FakeControl final : RunControl {
  std::vector<TrainPosition> checkpoints;
  std::vector<std::map<std::string, double>> rows;
  int votes = 0, others_stop_at_vote = -1, preempt_at_vote = -1;
  void check_signal() override {}
  Votes vote(const Votes& mine) override {
    ++votes;
    return Votes{mine.stop || votes == others_stop_at_vote, votes == preempt_at_vote};
  }
  std::filesystem::path save_checkpoint(const TrainPosition& p) override {
    checkpoints.push_back(p);
    return "fake.ckpt";
  }
  [[noreturn]] void preempted(const TrainPosition& p) override {
    save_checkpoint(p);
    throw RunAborted(KILN_FAILURE_PREEMPTED, "preempted");
  }
  void log_row(const std::map<std::string, double>& row) override { rows.push_back(row); }
};

std::string text(const TrainPosition& p) {
  return std::to_string(p.epoch) + "/" + std::to_string(p.next_batch) + "/" + std::to_string(p.global_step);
}

// One fit, put together as the host does, over the fakes.
struct Fit {
  FakeModel model;
  FakeData data;
  FakeEvents events;
  FakeMetrics metrics;
  FakeControl control;
  Progress progress{Progress::Mode::none, 50};
  LoopContext context{model, data, events, metrics, progress, control};
  torch::optim::SGD optimizer{model.net->parameters(), torch::optim::SGDOptions(0.1)};
  std::vector<at::Tensor> trainable = model.net->parameters();
  SchedulerConfig scheduler;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<StopCondition> stop;
  FitSettings settings;

  Fit(int64_t max_epochs, int64_t max_steps, int world_size = 1, int64_t vote_every = 1) {
    context.max_epochs = max_epochs;
    context.max_steps = max_steps;
    context.world_size = world_size;
    schedule = std::make_unique<LrSchedule>(scheduler, 0.1, 10);
    stop = std::make_unique<StopCondition>(max_epochs, max_steps, vote_every);
    settings.training.spec = EpochSpec{false, 4, BatchLimit{}};  // 10 rows: batches of 4, 4, 2
    settings.val = EpochSpec{false, 4, BatchLimit{}};
    settings.test = EpochSpec{false, 4, BatchLimit{}};
    settings.checkpoint_every_n_epochs = 1;
  }
  TrainPosition run(const TrainPosition& start = {}) {
    FitLoop loop(context, settings, Optimization{optimizer, *schedule, trainable, nullptr}, *stop);
    loop.run(start);
    return loop.position();
  }
};

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
  // The cut-short epoch gets no epoch checkpoint.
  ASSERT_EQ(fit.control.checkpoints.size(), 1u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "1/0/3");
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

TEST(FitLoopTest, StepCheckpointsFollowEveryNSteps) {
  Fit fit(1, -1);
  fit.settings.checkpoint_every_n_epochs = 0;
  fit.settings.training.checkpoint_every_n_steps = 2;
  fit.run();
  ASSERT_EQ(fit.control.checkpoints.size(), 1u);
  EXPECT_EQ(text(fit.control.checkpoints[0]), "0/2/2");
}

TEST(FitLoopTest, TestAfterFitRunsTheTestSplitOnceWithItsOwnRow) {
  Fit fit(1, -1);
  fit.settings.test_after_fit = true;
  fit.run();
  EXPECT_EQ(fit.events.seen.back(), "on_test_end");
  ASSERT_EQ(fit.control.rows.size(), 2u);
  EXPECT_EQ(fit.control.rows[1].at("epoch"), 0);
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
