// In-process fakes of the loops' parts (loop_parts/loop_parts.hpp): a
// linear model, splits of fixed lengths, recorders of events, metrics,
// votes and checkpoints, and one fit put together as the host does. Used by
// the loop tests and by the GPU tests (with a device).
#pragma once

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/collection.hpp"
#include "metrics/metric_store.hpp"
#include "metrics/tensor_metrics.hpp"
#include "plugin/host_objects.hpp"
#include "train/loops/evaluation_loop.hpp"
#include "train/loops/fit_loop.hpp"
#include "optim/nonfinite_watch.hpp"
#include "train/loops/predict_loop.hpp"
#include "train/loops/stop_condition.hpp"
#include "optim/replicated_step.hpp"
#include "optim/optim.hpp"
#include "optim/precision.hpp"
#include "train/progress.hpp"
#include "train/session.hpp"

namespace kiln::test {


// A linear model; every call is written down.
struct FakeModel final : StepModel {
  torch::nn::Linear net{4, 1};
  std::vector<std::string> calls;
  bool has_val = true, has_test = true;

  bool has_step(kiln_split split) const override {
    return split == KILN_SPLIT_VAL ? has_val : split == KILN_SPLIT_TEST ? has_test : true;
  }
  Collection* collect_into = nullptr;  // set: the step collects its outputs, as a plugin would
  std::function<void(int64_t)> on_train;  // set: called in each training step, with its batch
  at::Tensor training_step(kiln_batch& batch, int64_t b) override {
    calls.push_back("train " + std::to_string(b));
    if (on_train) on_train(b);
    const at::Tensor out = net->forward(batch.tensors[0].second);
    if (collect_into) {
      const std::string problem = collect_into->add("out", out);
      if (!problem.empty()) throw std::runtime_error(problem);
    }
    return out.pow(2).mean();
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
  c10::Device device{c10::kCPU};  // where batches are made (the host moves them there)

  struct Stream final : BatchStream {
    int64_t rows_left, batch_size, left, first;
    c10::Device device;
    int64_t total;  // the split's rows
    Stream(int64_t rows, int64_t bs, int64_t batches, int64_t first, c10::Device device)
        : rows_left(rows), batch_size(bs), left(batches), first(first), device(device), total(first * bs + rows) {}
    int64_t size() const override { return left; }
    int64_t first_batch() const override { return first; }
    int64_t position_after(int64_t batch) const override { return (batch + 1) * batch_size; }
    std::vector<int64_t> sample_indices(int64_t batch) const override {
      std::vector<int64_t> out;
      for (int64_t i = batch * batch_size; i < std::min(total, (batch + 1) * batch_size); ++i) out.push_back(i);
      return out;
    }
    BatchPtr next() override {
      const int64_t rows = std::min(batch_size, rows_left);
      rows_left -= rows;
      --left;
      BatchPtr batch(new kiln_batch);
      batch->tensors.emplace_back("x", torch::ones({rows, 4}, device));
      return batch;
    }
  };

  int64_t length(kiln_split split) override { return lengths[split]; }
  int64_t batches_per_epoch(kiln_split split, const EpochSpec& spec) override {
    return spec.limit.apply((lengths[split] + spec.batch_size - 1) / spec.batch_size);
  }
  // One process: `first_sample` is a whole number of batches.
  std::unique_ptr<BatchStream> open(kiln_split split, const EpochSpec& spec, int64_t epoch,
                                    int64_t first_sample) override {
    const int64_t first = first_sample / spec.batch_size;
    opened.push_back(std::string(split_name(split)) + " epoch " + std::to_string(epoch) + " from " + std::to_string(first));
    const int64_t batches = batches_per_epoch(split, spec);
    return std::make_unique<Stream>(lengths[split] - first * spec.batch_size, spec.batch_size, batches - first, first,
                                    device);
  }
  [[noreturn]] void refuse_empty(kiln_split, const std::string& message) override { throw std::runtime_error(message); }
};

// The loops' collector in one process: the rows of each epoch, merged as
// the host merges every rank's.
struct FakeCollector final : StepCollector {
  Collection collection;
  std::vector<int64_t> rows_per_epoch;
  void begin_step(kiln_split, std::vector<int64_t> indices, int64_t batch) override {
    collection.begin_step(indices.data(), indices.size(), batch);
  }
  void end_step(kiln_split) override {
    const std::string problem = collection.end_step();
    if (!problem.empty()) throw std::runtime_error(problem);
  }
  void drop_step(kiln_split) override { collection.drop_step(); }
  void end_epoch(kiln_split, const kiln_progress&) override {
    const auto merged = merge_collections({collection.serialize()});
    collection.clear();
    rows_per_epoch.push_back(merged.front().second.size(0));
  }
  void discard(kiln_split) override { collection.clear(); }
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
  // Set: the loss is kept as a tensor and read at log points, as the host
  // does for a device's (TensorMetrics deferring CPU values too).
  std::optional<TensorMetrics> on_device;
  void record(const char* name, double value, double weight, uint32_t flags) override {
    store.record(name, value, weight, flags);
  }
  void record_loss(const at::Tensor& loss, double weight) override {
    if (on_device)
      on_device->record("train/loss", loss, weight, KILN_METRIC_REDUCE_MEAN);
    else
      record("train/loss", loss.item<double>(), weight, KILN_METRIC_REDUCE_MEAN);
  }
  std::map<std::string, double> reduce() override {
    if (on_device) on_device->flush_into(store);
    return store.reduce();
  }
  void set_aside() override {
    if (on_device) on_device->flush_into(store);
    store.set_aside();
  }
  void take_back() override { store.take_back(); }
  void discard() override {
    if (on_device) on_device->flush_into(store);
    store.discard_pending();
  }
};

// Counts reads of a tensor's value by the host (item(), and everything else
// that ends in aten::_local_scalar_dense) on this thread while it lives.
class HostReads {
 public:
  HostReads()
      : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&HostReads::seen).needsInputs(false))) {
    count_ = 0;
  }
  ~HostReads() { at::removeCallback(handle_); }
  int count() const { return count_; }

 private:
  static std::unique_ptr<at::ObserverContext> seen(const at::RecordFunction& fn) {
    if (std::string_view(fn.name()) == "aten::_local_scalar_dense") ++count_;
    return nullptr;
  }
  static inline thread_local int count_ = 0;
  at::CallbackHandle handle_;
};

// Votes as other ranks would answer them: `others_stop_at_vote` N means
// another rank asks to stop at the Nth vote; `preempt_at_vote` and
// `others_out_of_time_at_vote` likewise.
struct FakeControl final : RunControl {
  std::vector<TrainPosition> checkpoints;
  std::vector<std::map<std::string, double>> rows;
  int finishes = 0;  // finish_checkpoints() calls
  int votes = 0, others_stop_at_vote = -1, preempt_at_vote = -1, others_out_of_time_at_vote = -1;
  bool checkpoints_on = true;
  // Called at each commit, before it is recorded: what a test checks the
  // state at the commit with (e.g. that the epoch's metrics are unreduced).
  std::function<void(const TrainPosition&)> on_save;
  void check_signal() override {}
  Votes vote(const Votes& mine) override {
    ++votes;
    return Votes{mine.stop || votes == others_stop_at_vote, votes == preempt_at_vote,
                 mine.out_of_time || votes == others_out_of_time_at_vote};
  }
  bool checkpointing() const override { return checkpoints_on; }
  void finish_checkpoints() override { ++finishes; }
  std::filesystem::path save_checkpoint(const TrainPosition& p) override {
    if (on_save) on_save(p);
    checkpoints.push_back(p);
    return "fake.ckpt";
  }
  [[noreturn]] void preempted(const TrainPosition& p) override {
    save_checkpoint(p);
    throw RunAborted(KILN_FAILURE_PREEMPTED, "preempted");
  }
  // Kept as metrics.csv has it: the epoch and step as columns.
  void log_row(const LogRow& row) override {
    std::map<std::string, double> columns = row.metrics;
    columns["epoch"] = static_cast<double>(row.epoch);
    columns["step"] = static_cast<double>(row.step);
    rows.push_back(columns);
  }
};

inline std::string text(const TrainPosition& p) {
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

  Fit(int64_t max_epochs, int64_t max_steps, int world_size = 1, int64_t vote_every = 1,
      c10::Device device = c10::Device(c10::kCPU)) {
    model.net->to(device);  // in place: the optimizer's tensors follow
    data.device = device;
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
  GradScaler* scaler = nullptr;
  NonfiniteWatch* nonfinite = nullptr;
  GradientClipping clipping;
  torch::optim::Optimizer* other_optimizer = nullptr;  // set: stepped instead of `optimizer`
  OptimizerStep* other_step = nullptr;                 // set: the seam's implementation instead of the replicated one
  TrainPosition run(const TrainPosition& start = {}) {
    torch::optim::Optimizer& stepped = other_optimizer ? *other_optimizer : optimizer;
    ReplicatedStep replicated({stepped, trainable, clipping, nullptr, scaler, nonfinite});
    Optimization optimization{other_step ? *other_step : replicated, stepped, *schedule};
    optimization.nonfinite = nonfinite;
    FitLoop loop(context, settings, optimization, *stop);
    loop.run(start);
    return loop.position();
  }
};

}  // namespace kiln::test
