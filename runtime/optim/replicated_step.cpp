#include "optim/replicated_step.hpp"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "distributed/grad_sync.hpp"
#include "optim/master_weights.hpp"
#include "optim/nonfinite_watch.hpp"
#include "optim/precision.hpp"
#include "profiling/profiler.hpp"
#include "optim/weight_averaging.hpp"
#include "util/errors.hpp"

namespace kiln {

void ReplicatedStep::before_forward() {
  if (p_.grad_sync) p_.grad_sync->before_forward();
}

void ReplicatedStep::backward(const at::Tensor& loss, bool sync) {
  const at::Tensor scaled = p_.scaler ? p_.scaler->scale(loss) : loss;
  GradSync* grad_sync = p_.grad_sync;
  if (!grad_sync) {
    scaled.backward();
    return;
  }
  grad_sync->before_backward(scaled, sync);
  // The all-reduce's waits for slower ranks happen inside backward.
  Profiler* profiler = p_.profiler;
  const std::pair<double, int64_t> waited_before = profiler ? grad_sync->waited() : std::pair<double, int64_t>{};
  // The Reducer all-reduces inside backward: its failures are a peer's.
  try {
    scaled.backward();
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

void ReplicatedStep::step(int64_t global_step) {
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
    // Under a gradient scaler an inf norm is the scaler's to skip, not a fault.
    NonfiniteWatch* watch = p_.scaler ? nullptr : p_.nonfinite;
    if (p_.model) gradients_to_masters(*p_.model, p_.trainable);
    if (GradScaler* scaler = p_.scaler) {
      scaler->unscale(p_.trainable);
      clip_gradients(p_.trainable, p_.clipping, {}, watch);
      if (scaler->step_and_update()) p_.optimizer.step();  // skipped: inf/NaN gradients (counted)
    } else {
      clip_gradients(p_.trainable, p_.clipping, {}, watch);
      p_.optimizer.step();
    }
    if (p_.model) masters_to_model(p_.trainable, *p_.model);
  }
  clear_gradients();
  if (p_.averaging) p_.averaging->after_step(global_step);
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
void ReplicatedStep::clear_gradients() {
  for (const auto& p : p_.trainable)
    if (p.grad().defined()) p.mutable_grad().reset();
  if (p_.model)
    for (const auto& p : *p_.model)
      if (p.grad().defined()) p.mutable_grad().reset();
}

}  // namespace kiln
