#include "train/loops/training_epoch_loop.hpp"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include "distributed/grad_sync.hpp"
#include "plugin/host_objects.hpp"
#include "train/nonfinite_watch.hpp"
#include "train/optim.hpp"
#include "train/precision.hpp"
#include "train/progress.hpp"
#include "train/weight_averaging.hpp"
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

void TrainingEpochLoop::backward(const at::Tensor& loss, bool sync) {
  Profiler* profiler = context_.profiler;
  ProfileScope timed(profiler, Phase::backward);
  GradSync* grad_sync = optimization_.grad_sync;
  if (!grad_sync) {
    loss.backward();
    return;
  }
  grad_sync->before_backward(loss, sync);
  // The all-reduce's waits for slower ranks happen inside backward.
  const std::pair<double, int64_t> waited_before = profiler ? grad_sync->waited() : std::pair<double, int64_t>{};
  // The Reducer all-reduces inside backward: its failures are a peer's.
  try {
    loss.backward();
  } catch (const c10::Error& e) {
    throw PeerFailure(std::string("gradient all-reduce failed (another rank failed or stopped responding): ") +
                      e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw PeerFailure(std::string("gradient all-reduce failed (another rank failed or stopped responding): ") +
                      e.what());
  }
  if (profiler) {
    const std::pair<double, int64_t> waited = grad_sync->waited();
    profiler->carve(Phase::allreduce_wait, waited.first - waited_before.first, waited.second - waited_before.second);
  }
}

// The gradients are dropped, not zeroed: backward then writes each
// gradient where it would have added it to zeros, which saves a pass over
// every parameter to zero it and another to add to it (issue 11: ~6 % of
// mlp32's step). It is what PyTorch >= 2.0's zero_grad() does by default
// (set_to_none=True), and so Lightning; LibTorch 1.13's zeroes. As with
// set_to_none, a parameter that gets no gradient in a step is skipped by the
// optimizer rather than stepped with a zero gradient. With a GradSync the
// Reducer (gradient_as_bucket_view) divides each new gradient into its
// bucket and makes the gradient a view of it: no copy back after the
// all-reduce. LibTorch 1.13's Optimizer::zero_grad() would detach_() those
// views, which ATen refuses.
void TrainingEpochLoop::clear_gradients() {
  for (const auto& p : optimization_.trainable)
    if (p.grad().defined()) p.mutable_grad().reset();
}

// LibTorch's clip_grad_norm_ returns the norm as a double: a read-back of
// the device every step. The same arithmetic stays on the device here.
void TrainingEpochLoop::clip_gradients() {
  const double clip = settings_.gradient_clip_val;
  if (clip <= 0) return;
  if (settings_.clip_by_value) {
    torch::nn::utils::clip_grad_value_(optimization_.trainable, clip);
    return;
  }
  std::vector<at::Tensor> grads;
  for (const auto& p : optimization_.trainable)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.norm(2));
  const at::Tensor total = at::stack(norms).norm(2);
  // Under a gradient scaler an inf norm is the scaler's to skip, not a fault.
  if (optimization_.nonfinite && !optimization_.scaler) optimization_.nonfinite->add_grad_norm(total);
  const at::Tensor factor = (clip / (total + 1e-6)).clamp_max(1.0);
  for (auto& g : grads) g.mul_(factor);
}

at::Tensor TrainingEpochLoop::train_batch(BatchPtr batch, int64_t index, bool boundary,
                                          const BatchStream& stream) {
  LoopContext& c = context_;
  const int64_t accumulate = settings_.accumulate_grad_batches;
  if (optimization_.grad_sync) optimization_.grad_sync->before_forward();
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
  at::Tensor for_backward = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
  if (optimization_.scaler) for_backward = optimization_.scaler->scale(for_backward);
  loss = at::Tensor();
  batch.reset();
  backward(for_backward, /*sync=*/boundary);
  return shown;
}

void TrainingEpochLoop::optimizer_step() {
  LoopContext& c = context_;
  ProfileScope timed(c.profiler, Phase::optimizer_step);
  {
    // Nothing here builds a graph: every optimizer kiln builds is one of
    // LibTorch's, whose step() runs under its own NoGradGuard, without a
    // closure. Their ops still went through the autograd layer of the
    // dispatcher, which under no_grad only passes each call on: ~0.1 us an
    // op, 2.5 of mlp32's 60 us Adam step. Below it the same kernels run (the
    // weights are the same to the bit) and ADInplaceOrView still bumps each
    // in-place op's version counter, so a graph that saved a weight before
    // the step still refuses to backward through it
    // (unit.FitLoopTest.TheOptimizerStepRunsBelowTheAutogradLayerAndKeepsVersionCounters).
    at::NoGradGuard no_grad;
    at::AutoDispatchBelowAutograd below_autograd;
    if (GradScaler* scaler = optimization_.scaler) {
      scaler->unscale(optimization_.trainable);
      clip_gradients();
      if (scaler->step_and_update()) optimization_.optimizer.step();  // skipped: inf/NaN gradients (counted)
    } else {
      clip_gradients();
      optimization_.optimizer.step();
    }
  }
  clear_gradients();
  ++c.global_step;
  if (optimization_.averaging) optimization_.averaging->after_step(c.global_step);
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
  c.progress.begin(fmt::format("epoch {}", epoch), n);
  clear_gradients();
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
