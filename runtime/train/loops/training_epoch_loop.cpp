#include "train/loops/training_epoch_loop.hpp"

#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <torch/optim/optimizer.h>

#include "plugin/host_objects.hpp"
#include "optim/nonfinite_watch.hpp"
#include "optim/optim.hpp"
#include "train/progress.hpp"
#include "util/errors.hpp"
#include "util/activity.hpp"

namespace kiln {

namespace {

int64_t batch_rows(const kiln_batch& batch) {
  for (const auto& [name, tensor] : batch.tensors)
    if (tensor.dim() > 0) return tensor.size(0);
  return 1;
}

}  // namespace

TrainingEpochLoop::TrainingEpochLoop(LoopContext& context, const TrainingSettings& settings,
                                     Optimization optimization, StopCondition& stop, CheckpointPolicy& policy)
    : context_(context), settings_(settings), optimization_(optimization), stop_(stop), policy_(policy) {}

at::Tensor TrainingEpochLoop::train_batch(BatchPtr batch, int64_t index, bool boundary,
                                          const BatchStream& stream) {
  LoopContext& c = context_;
  const int64_t accumulate = settings_.accumulate_grad_batches;
  optimization_.step.before_forward();
  if (c.collector) c.collector->begin_step(KILN_SPLIT_TRAIN, stream.sample_indices(index), index);
  at::Tensor loss;
  {
    ProfileScope timed(c.profiler, Phase::training_step);
    loss = c.model.training_step(*batch, index);
  }
  if (c.collector) c.collector->end_step(KILN_SPLIT_TRAIN);
  // Detached once: the metrics, the monitors and the progress display all
  // keep this one (the graph is not kept alive by any of them).
  // variable_data() is detach() without the dispatcher (~3 k instructions a
  // step on LibTorch 1.13); nothing writes to either tensor in place.
  const at::Tensor shown = loss.variable_data();
  // Recorded as a tensor: read back only at log points (no sync per step).
  c.metrics.record_loss(shown, static_cast<double>(batch_rows(*batch)));
  if (optimization_.nonfinite) optimization_.nonfinite->add_loss(shown);
  const at::Tensor for_backward = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
  loss = at::Tensor();
  batch.reset();
  {
    ProfileScope timed(c.profiler, Phase::backward);
    optimization_.step.backward(for_backward, /*sync=*/boundary);
  }
  return shown;
}

void TrainingEpochLoop::optimizer_step() {
  LoopContext& c = context_;
  {
    ProfileScope timed(c.profiler, Phase::optimizer_step);
    optimization_.step.step(c.global_step + 1);
  }
  ++c.global_step;
  if (c.activity) c.activity->at_step(c.global_step);
  if (optimization_.schedule.per_step()) optimization_.schedule.apply(optimization_.optimizer, c.global_step);
}

TrainingEpochLoop::Result TrainingEpochLoop::run(int64_t epoch, int64_t first_sample,
                                                 const MidEpochValidation* validation) {
  LoopContext& c = context_;
  const bool single_process = c.world_size <= 1;
  std::unique_ptr<BatchStream> batches;
  {
    ProfileScope timed(c.profiler, Phase::get_batch_wait);
    batches = c.data.open(KILN_SPLIT_TRAIN, settings_.spec, epoch, first_sample);
  }
  const int64_t first_batch = batches->first_batch();
  const int64_t n = batches->size() + first_batch;
  Result result;
  result.batches = n;
  // Batches between validations: a fraction counts the whole epoch's
  // batches, so a resumed epoch validates where the first run would have.
  const int64_t val_every = validation ? std::max<int64_t>(validation->every.apply(n), 0) : 0;
  if (validation && !validation->every.is_fraction && validation->every.count > n && first_batch == 0)
    spdlog::warn("trainer.val_check_interval = {} is more than the {} training batches of epoch {}: it validates at "
                 "the epoch's end only",
                 validation->every.count, n, epoch);
  c.progress.begin(fmt::format("epoch {}", epoch), n, {epoch, c.max_epochs > 0 ? c.max_epochs - 1 : -1});
  optimization_.step.clear_gradients();
  int64_t b = first_batch;
  for (; b < n; ++b) {
    if (single_process) c.control.check_signal();  // distributed: agreed on at the votes
    BatchPtr batch;
    {
      ProfileScope timed(c.profiler, Phase::get_batch_wait);
      batch = batches->next();
    }
    result.samples += batch_rows(*batch) * c.world_size;
    const bool boundary = (b + 1) % settings_.accumulate_grad_batches == 0 || b + 1 == n;
    const at::Tensor shown = train_batch(std::move(batch), b, boundary, *batches);
    if (boundary) {
      optimizer_step();
      // Timed only where it reads: a step that is no log point costs a test.
      if (optimization_.nonfinite && optimization_.nonfinite->due(c.global_step)) {
        ProfileScope timed(c.profiler, Phase::logging);
        optimization_.nonfinite->check(c.global_step, epoch);
      }
      c.notify(Event::train_batch_end, c.progress_at(KILN_STAGE_FIT, epoch, b));
    }
    {
      ProfileScope timed(c.profiler, Phase::logging);
      c.progress.step(b, [&shown] { return shown.item<double>(); });
    }
    // Before the step's checkpoint, so a checkpoint monitoring a validation
    // metric ranks by this validation (Lightning's order too).
    if (val_every > 0 && val_every < n && (b + 1) % val_every == 0 && b + 1 < n) validation->validate(epoch, b);
    // A stop is acted on only after an optimizer step, never inside an
    // accumulation: the gradients accumulated so far are in no checkpoint,
    // so a run stopped there could not continue exactly.
    const std::optional<StopReason> stop =
        boundary ? policy_.after_step(TrainPosition{epoch, b + 1, c.global_step, batches->position_after(b)})
                 : std::nullopt;
    if (stop) {
      result.stopped = true;
      ++b;
      break;
    }
  }
  c.progress.end();
  // The epoch's end is a log point: the steps since the last one.
  if (optimization_.nonfinite) {
    ProfileScope timed(c.profiler, Phase::logging);
    optimization_.nonfinite->check(c.global_step, epoch);
  }
  result.next_batch = b;
  result.next_sample = b > first_batch ? batches->position_after(b - 1) : first_sample;
  return result;
}

}  // namespace kiln
