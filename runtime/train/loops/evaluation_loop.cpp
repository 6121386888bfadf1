#include "train/loops/evaluation_loop.hpp"

#include <cmath>

#include <spdlog/spdlog.h>
#include <ATen/core/grad_mode.h>

#include "plugin/plugin_instance.hpp"
#include "train/progress.hpp"
#include "util/errors.hpp"

namespace kiln {

std::string format_metrics(const std::map<std::string, double>& metrics) {
  std::string out;
  for (const auto& [name, value] : metrics) out += fmt::format("  {} {:.4f}", name, value);
  return out;
}

EvaluationLoop::EvaluationLoop(LoopContext& context, kiln_split split, EpochSpec spec, bool standalone)
    : context_(context), split_(split), spec_(spec), standalone_(standalone) {}

std::map<std::string, double> EvaluationLoop::run(int64_t epoch) {
  LoopContext& c = context_;
  const bool is_val = split_ == KILN_SPLIT_VAL;
  const kiln_stage stage = is_val ? (standalone_ ? KILN_STAGE_VALIDATE : KILN_STAGE_FIT) : KILN_STAGE_TEST;
  if (c.data.length(split_) == 0) c.data.refuse_empty(split_, fmt::format("the {} split is empty", split_name(split_)));
  if (is_val) c.notify(Event::validation_start, c.progress_at(stage, epoch, -1));
  {
    at::NoGradGuard no_grad;
    std::unique_ptr<BatchStream> batches = c.data.open(split_, spec_, 0, 0);
    step_through(*batches, split_name(split_), /*in_sanity_check=*/false);
    if (c.collector) c.collector->end_epoch(split_, c.progress_at(stage, epoch, -1));
  }
  auto metrics = c.metrics.reduce();
  if (standalone_ || !is_val) spdlog::info("{}:{}", split_name(split_), format_metrics(metrics));
  c.notify(is_val ? Event::validation_end : Event::test_end, c.progress_at(stage, epoch, -1));
  if (standalone_) c.control.log_row(LogRow{LogRow::Kind::epoch, 0, c.global_step, metrics});
  return metrics;
}

void EvaluationLoop::sanity_check(int64_t max_batches) {
  LoopContext& c = context_;
  if (c.data.length(split_) == 0) return;
  EpochSpec spec = spec_;
  // Only the batches it runs are planned (and fetched ahead).
  int64_t n = c.data.batches_per_epoch(split_, spec);
  if (max_batches >= 0) n = std::min(n, max_batches);
  // limit_val_batches = 0: validation is off, and so is its check. With
  // sharded parameters the ranks decide together: one rank's empty share of
  // an uneven split must not leave the others waiting in step_through's count.
  if (c.residency ? c.residency->most_batches(n) == 0 : n == 0) return;
  spec.limit = BatchLimit{false, 1.0, n};
  c.metrics.set_aside();
  {
    at::NoGradGuard no_grad;
    std::unique_ptr<BatchStream> batches = c.data.open(split_, spec, 0, 0);
    n = step_through(*batches, "sanity check", /*in_sanity_check=*/true);
  }
  if (c.collector) c.collector->discard(split_);
  c.metrics.discard();
  c.metrics.take_back();
  spdlog::info("sanity check: {} {} batch{} passed", n, split_name(split_), n == 1 ? "" : "es");
}

int64_t EvaluationLoop::step_through(BatchStream& batches, const std::string& title, bool in_sanity_check) {
  LoopContext& c = context_;
  const int64_t n = batches.size();
  // Sharded parameters: a rank with fewer batches (validation is not
  // padded) runs its last one again, uncounted, as often as the others run
  // one more, so that every rank gathers as often.
  const int64_t repeats = c.residency ? c.residency->most_batches(n) - n : 0;
  if (repeats > 0 && n == 0)
    throw InputError(fmt::format(
        "distributed.shard = \"parameters\": rank {} has no {} batch where another has {}; every rank gathers the "
        "weights each batch reads, so each needs a batch to repeat (use fewer processes, or distributed.shard = "
        "\"gradients\")",
        c.rank, split_name(split_), repeats));
  BatchPtr last;
  std::vector<int64_t> last_indices;
  c.progress.begin(title, n);
  for (int64_t b = 0; b < n; ++b) {
    c.control.check_signal();
    try {
      BatchPtr batch = batches.next();
      if (c.collector) c.collector->begin_step(split_, batches.sample_indices(b), b);
      c.model.evaluation_step(split_, *batch, b);
      if (c.residency) c.residency->after_batch();
      if (repeats > 0 && b == n - 1) {
        last = std::move(batch);
        last_indices = batches.sample_indices(b);
      }
      if (c.collector) c.collector->end_step(split_);
    } catch (const HookError& e) {
      if (!in_sanity_check) throw;
      throw HookError(e.plugin_id(), e.slot(), e.hook(),
                      e.message() + fmt::format(" (in the sanity check before the first training step: {} batch {} "
                                                "of {}; trainer.num_sanity_val_steps = 0 skips it)",
                                                split_name(split_), b, n),
                      e.code());
    }
    c.progress.step(b);
  }
  c.progress.end();
  if (repeats > 0) {
    // Counted nowhere: what they log is dropped (the sanity check drops all).
    if (!in_sanity_check) c.metrics.set_aside();
    for (int64_t r = 0; r < repeats; ++r) {
      if (c.collector) c.collector->begin_step(split_, last_indices, n - 1);
      c.model.evaluation_step(split_, *last, n - 1);
      if (c.collector) c.collector->drop_step(split_);
      c.residency->after_batch();
    }
    if (!in_sanity_check) {
      c.metrics.discard();
      c.metrics.take_back();
    }
  }
  return n;
}

}  // namespace kiln
