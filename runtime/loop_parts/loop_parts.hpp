// What the loops are made of: the interfaces they call, so that a loop can be
// driven in-process by fakes (tests/unit/loops_test.cpp) as well as by the
// host's plugin proxies (plugin/proxies.hpp) and run wiring (train/run/trainer).
// Nothing here touches a kiln_*_hooks table or a process group.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ckpt/checkpoint_meta.hpp"
#include "config/manifest.hpp"
#include "kiln/abi.h"
#include "metrics/logger.hpp"
#include "common/batch.hpp"
#include "profiling/profiler.hpp"

namespace kiln {

class Activity;

class Progress;

const char* split_name(kiln_split split);
// "  name value  name value" for log lines.
std::string format_metrics(const std::map<std::string, double>& metrics);

// The optimizer-step seam: what happens to the gradients and the
// parameters around each optimizer step, which the training loop drives
// without knowing how. Today's is data parallelism's replicated step
// (optim/replicated_step.hpp: DDP's bucketed all-reduce inside backward,
// the gradient scaler, clipping, the optimizer, the averaged weights); a
// sharded one (ZeRO) is another implementation, not a branch in the loop.
class OptimizerStep {
 public:
  virtual ~OptimizerStep() = default;
  // Before each training step's forward.
  virtual void before_forward() {}
  // Back-propagates one micro-batch's loss (already divided for gradient
  // accumulation; scaled here under 16-mixed). `sync`: it ends an
  // accumulation, so its gradients are reduced across ranks.
  virtual void backward(const at::Tensor& loss, bool sync) = 0;
  // At an accumulation's end: the gradients' treatment (unscaling,
  // clipping, the norm reduced over whatever each rank holds), the
  // optimizer's step, what follows for the parameters; then the gradients
  // are dropped. `global_step`: the step this makes, counted from 1.
  virtual void step(int64_t global_step) = 0;
  // Drops the gradients without a step (an epoch's start).
  virtual void clear_gradients() = 0;
};

// The model as the loops call it. The host's is ModelProxy (plugin/proxies).
class StepModel {
 public:
  virtual ~StepModel() = default;
  // Whether the model implements the step for `split` (train: training_step).
  virtual bool has_step(kiln_split split) const = 0;
  // The loss of one batch: a scalar that requires grad (checked here, so the
  // loops never check a plugin's result by hand).
  virtual at::Tensor training_step(kiln_batch& batch, int64_t batch_index) = 0;
  // validation_step (KILN_SPLIT_VAL) or test_step (KILN_SPLIT_TEST).
  virtual void evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) = 0;
  virtual at::Tensor predict_step(kiln_batch& batch, int64_t batch_index) = 0;
};

// The callback hooks, as events (docs/hooks.md gives their order).
enum class Event {
  fit_start,
  train_epoch_start,
  train_batch_end,
  train_epoch_end,
  validation_start,
  validation_end,
  test_end,
  fit_end,
};
const char* event_name(Event event);

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void notify(Event event, const kiln_progress& progress) = 0;
};

// How one split is read in an epoch.
struct EpochSpec {
  bool shuffle = false;
  int64_t batch_size = 1;
  BatchLimit limit;
};

// One epoch of one split, in the sampler's order.
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  virtual int64_t size() const = 0;  // batches left to take
  virtual BatchPtr next() = 0;
  // The epoch's number of the stream's first batch (0 unless resumed).
  virtual int64_t first_batch() const = 0;
  // How far the epoch's global sample order is trained once every rank has
  // run the epoch's batch `batch` (what a checkpoint after it records).
  virtual int64_t position_after(int64_t batch) const = 0;
  // The sample indices of the epoch's batch `batch` on this rank (what a
  // model's collected rows are tagged with).
  virtual std::vector<int64_t> sample_indices(int64_t batch) const = 0;
};

// The data module's splits as the loops read them: sampled, sharded, fetched.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t length(kiln_split split) = 0;
  // Batches this rank runs in one epoch of `split`.
  virtual int64_t batches_per_epoch(kiln_split split, const EpochSpec& spec) = 0;
  // Epoch `epoch` of `split`, after the first `first_sample` samples of the
  // epoch's global order (a resumed epoch: data/sampler.hpp, first_sample).
  virtual std::unique_ptr<BatchStream> open(kiln_split split, const EpochSpec& spec, int64_t epoch,
                                            int64_t first_sample) = 0;
  // Ends the run: `split` has no samples and the command needs some. The
  // error names the data module (the host's throws HookError for `length`).
  [[noreturn]] virtual void refuse_empty(kiln_split split, const std::string& message) = 0;
};

// Metrics: recorded along the way, reduced at fixed points (every rank
// together when distributed).
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void record(const char* name, double value, double weight, uint32_t flags) = 0;
  // The host's own loss: a tensor, read back only at log points.
  virtual void record_loss(const at::Tensor& loss, double weight) = 0;
  virtual std::map<std::string, double> reduce() = 0;
  // Around a validation inside a training epoch: what the epoch has recorded
  // so far is put aside (read back, it is a log point), so the validation's
  // reduce() sees only its own records, and taken back after it.
  virtual void set_aside() = 0;
  virtual void take_back() = 0;
  // Drops what was recorded since the last reduce() or set_aside(), on this
  // rank alone (the sanity check's records: no collective, nothing logged).
  virtual void discard() = 0;
};

// Per-sample rows that the model's steps collect (kiln_host.collect), and
// the epoch's end, where every rank's rows are gathered and handed to the
// model's on_epoch_end and the callbacks' on_epoch_collected
// (docs/metrics.md). The host's is EpochCollections (train/run); a loop
// without one collects nothing.
class StepCollector {
 public:
  virtual ~StepCollector() = default;
  // Around one model step of `split` on the samples `indices` (batch
  // `batch` of the epoch). end_step throws when the step collected wrongly.
  virtual void begin_step(kiln_split split, std::vector<int64_t> indices, int64_t batch) = 0;
  virtual void end_step(kiln_split split) = 0;
  // Ends a step whose rows are dropped (a repeated batch: EvaluationResidency).
  virtual void drop_step(kiln_split split) = 0;
  // Every rank together, after the epoch's last step of `split` and before
  // its metrics are reduced.
  virtual void end_epoch(kiln_split split, const kiln_progress& progress) = 0;
  // Drops this rank's rows of `split` without handing them on (the sanity
  // check's: no collective).
  virtual void discard(kiln_split split) = 0;
};

// What every rank decides together at a stop vote.
struct Votes {
  bool stop = false;     // some rank's callback asked to stop
  bool preempt = false;  // a preemption signal arrived on some rank
  bool out_of_time = false;  // max_time passed on some rank's clock
};

// The run around the loops: signals, votes, checkpoints, the metrics file.
class RunControl {
 public:
  virtual ~RunControl() = default;
  // Throws (exit 130) when SIGINT/SIGTERM arrived; outside vote points.
  virtual void check_signal() = 0;
  // Every rank's votes combined; throws when some rank was interrupted.
  virtual Votes vote(const Votes& mine) = 0;
  // Every rank together after the sanity check: a rank whose check failed
  // has left, so the others end here, before any training step.
  virtual void after_sanity_check() {}
  // Commits a checkpoint of the run at `position` on every rank together.
  virtual std::filesystem::path save_checkpoint(const TrainPosition& position) = 0;
  // Every rank together: waits for an asynchronous commit still in flight
  // (the end of fit); throws on every rank when it failed.
  virtual void finish_checkpoints() = 0;
  // Whether this run writes checkpoints ([checkpoint] present and enabled).
  virtual bool checkpointing() const = 0;
  // A preemption: commits a checkpoint at `position`, then ends the run
  // (throws RunAborted, KILN_FAILURE_PREEMPTED; exit 75).
  [[noreturn]] virtual void preempted(const TrainPosition& position) = 0;
  // One row of metrics.csv and the other loggers (written by rank 0 only).
  virtual void log_row(const LogRow& row) = 0;
};

// distributed.shard = "parameters" (optim/sharded_parameters.hpp): each
// operator gathers the weights it reads from every rank, so every rank
// must run as many evaluation batches as the others.
class EvaluationResidency {
 public:
  virtual ~EvaluationResidency() = default;
  // The most batches any rank has of an evaluation this rank has `mine` of
  // (a collective).
  virtual int64_t most_batches(int64_t mine) = 0;
  // After each evaluation batch: what it gathered is freed, so that every
  // batch gathers the same way.
  virtual void after_batch() = 0;
};

// The state the loops share.
struct LoopContext {
  StepModel& model;
  BatchSource& data;
  EventSink& events;
  MetricSink& metrics;
  Progress& progress;
  RunControl& control;
  StepCollector* collector = nullptr;  // null: nothing is collected
  Activity* activity = nullptr;        // null: no supervisor to tell the step
  Profiler* profiler = nullptr;        // null: [profiler] off
  EvaluationResidency* residency = nullptr;  // null: every rank holds the whole weights
  int32_t rank = 0;
  int32_t world_size = 1;
  int64_t max_epochs = 1;
  int64_t max_steps = -1;
  int64_t global_step = 0;  // optimizer steps so far; counted by the training epoch loop

  kiln_progress progress_at(kiln_stage stage, int64_t epoch, int64_t batch_index) const;
  // The callbacks' hook for `event` (timed as the profiler's callbacks phase).
  void notify(Event event, const kiln_progress& p) {
    ProfileScope timed(profiler, Phase::callbacks);
    events.notify(event, p);
  }
};

}  // namespace kiln
