// Calls the data module's get_batch on host threads, ahead of the training
// step, and hands batches back in plan order. Without
// KILN_DATA_CONCURRENT_GET_BATCH one thread calls it at a time. An error from
// get_batch is rethrown on the main thread when its batch is taken.
// `gather_inline` makes the same call on the calling thread instead (the
// main thread, trainer.data_workers = 0), with the same checks.
//
// When the run fails (the prefetcher is destroyed while an exception unwinds)
// a get_batch call that does not return within kAbandonAfter is abandoned:
// its thread is detached, keeps the plugin's library and host table alive,
// and drops whatever the call returns. The error is reported and cleanup
// begins regardless; the data module's teardown may then run while that
// get_batch is still in progress (docs/hooks.md), and the host skips its
// destroy if the call still has not returned after teardown.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include "kiln/abi.h"
#include "common/batch.hpp"
#include "plugin/plugin_instance.hpp"
#include "data/sampler.hpp"

namespace kiln {

class Profiler;

class Activity;

// What every get_batch call of one stream shares: the data module, the
// split, the epoch's plan, and what runs on each batch before it is handed
// over (`prepare`: the batch mover's pinning; it may throw, as get_batch).
struct BatchRequest {
  const PluginInstance& data;
  kiln_split split;
  std::shared_ptr<const BatchPlan> plan;
  std::function<void(kiln_batch&)> prepare;
  // [profiler] trace: the worker threads' get_batch calls (shared: a worker
  // abandoned in a stuck get_batch may outlive the run's loops).
  std::shared_ptr<Profiler> profiler = nullptr;
};

// Batch `b` of the plan, fetched on this thread: get_batch (serialized with
// every other caller unless the plugin is concurrent), checked and prepared.
// A failure throws HookError naming the data module and get_batch.
// `activity` (may be null) is told the main thread is inside get_batch.
BatchPtr gather_inline(const BatchRequest& request, size_t b, Activity* activity);

class Prefetcher {
 public:
  static constexpr std::chrono::seconds kAbandonAfter{2};

  // Fetches batches [first, last) of the request's plan on `threads` threads,
  // at most `depth` ahead of the batch taken last.
  Prefetcher(BatchRequest request, size_t first, size_t last, int threads, int depth);
  ~Prefetcher();  // stops the workers and frees batches not taken
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  size_t size() const;  // batches in its range
  // The next batch in plan order; blocks until it is ready.
  BatchPtr next();
  // The next batch if it is ready now, else null without waiting; a batch
  // whose get_batch failed is left for next(), which throws its error.
  BatchPtr try_next();

 private:
  struct State;  // shared with the worker threads, which may outlive this object
  std::shared_ptr<State> state_;
  int uncaught_at_construction_;
};

}  // namespace kiln
