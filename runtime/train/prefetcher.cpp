#include "train/prefetcher.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

// Weak: the host needs no OpenMP at link time; it resolves at run time to the
// OpenMP runtime LibTorch loaded, and stays NULL for a LibTorch without one.
extern "C" __attribute__((weak)) void omp_set_num_threads(int);

namespace kiln {

namespace {

// get_batch runs with one intra-op thread, as PyTorch's DataLoader workers
// do: a second OpenMP team busy-waiting on the cores the training step's team
// needs costs more than any gather it could speed up (bench/README.md).
void use_one_intra_op_thread() {
  (void)at::get_num_threads();  // LibTorch's lazy per-thread set-up first, so it cannot undo ours
  if (omp_set_num_threads != nullptr) omp_set_num_threads(1);
}

}  // namespace

struct Prefetcher::State {
  struct Slot {
    BatchPtr batch;
    std::exception_ptr error;
  };

  State(const PluginInstance& data, kiln_split split, BatchPlan plan, size_t depth,
        std::function<void(kiln_batch&)> prepare)
      : data(data), keep(data.keep_alive()), split(split), plan(std::move(plan)), depth(depth),
        serialize((data.plugin().descriptor->flags & KILN_DATA_CONCURRENT_GET_BATCH) == 0),
        prepare(std::move(prepare)) {}

  const PluginInstance& data;  // not to be touched once abandoned
  const PluginInstance::KeepAlive keep;
  const kiln_split split;
  const BatchPlan plan;
  const size_t depth;
  const bool serialize;
  const std::function<void(kiln_batch&)> prepare;

  std::mutex mutex;
  std::condition_variable ready, room, exited;
  std::mutex call_mutex;  // serializes get_batch when the plugin is not concurrent
  size_t next_to_claim = 0, next_to_take = 0;
  std::map<size_t, Slot> done;
  bool stopping = false;
  bool abandoned = false;  // the owner is gone: drop results, touch nothing of the plugin's
  int running = 0;

  void work();
};

void Prefetcher::State::work() {
  use_one_intra_op_thread();
  const auto& hooks = *static_cast<const kiln_data_hooks*>(keep.descriptor->hooks);
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lock(mutex);
      room.wait(lock, [&] { return stopping || next_to_claim >= plan.size() || next_to_claim < next_to_take + depth; });
      if (stopping || next_to_claim >= plan.size()) break;
      b = next_to_claim++;
    }
    kiln_batch* out = nullptr;
    kiln_error* error;
    {
      std::unique_lock<std::mutex> call_lock(call_mutex, std::defer_lock);
      if (serialize) call_lock.lock();
      keep.in_flight->fetch_add(1);
      error = hooks.get_batch(keep.instance, split, plan.batch(b), plan.batch_size(b), &out);
      keep.in_flight->fetch_sub(1);
    }
    Slot slot;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (abandoned) {
        // Nobody will take it, and the PluginInstance may be gone.
        (void)take_error(error);
        BatchPtr(out).reset();
        break;
      }
    }
    try {
      data.check(error, "get_batch");
      if (out == nullptr) data.check(make_error("get_batch returned no batch"), "get_batch");
      slot.batch.reset(out);
      if (prepare) prepare(*slot.batch);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      done.emplace(b, std::move(slot));
    }
    ready.notify_all();
  }
  std::lock_guard<std::mutex> lock(mutex);
  --running;
  exited.notify_all();
}

Prefetcher::Prefetcher(const PluginInstance& data, kiln_split split, BatchPlan plan, int threads, int depth,
                       std::function<void(kiln_batch&)> prepare)
    : state_(std::make_shared<State>(data, split, std::move(plan), static_cast<size_t>(std::max(1, depth)),
                                     std::move(prepare))),
      uncaught_at_construction_(std::uncaught_exceptions()) {
  const int count = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(state_->plan.size(), 1))));
  state_->running = count;
  for (int i = 0; i < count; ++i) {
    // Each thread owns a reference: an abandoned thread keeps the state alive.
    std::thread([state = state_] { state->work(); }).detach();
  }
}

Prefetcher::~Prefetcher() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  s.stopping = true;
  s.room.notify_all();
  // A normal end waits for calls in flight, however slow; an end by an
  // exception (a failed step, an interruption) waits a bounded time, so the
  // error is reported and cleanup begins even if get_batch is stuck.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_construction_;
  if (!unwinding) {
    s.exited.wait(lock, [&] { return s.running == 0; });
  } else if (!s.exited.wait_for(lock, kAbandonAfter, [&] { return s.running == 0; })) {
    s.abandoned = true;
    spdlog::warn("data module '{}': get_batch has not returned for {} s after the run failed; its prefetch "
                 "thread is abandoned (teardown may run while it is still inside get_batch)",
                 s.data.id(), kAbandonAfter.count());
  }
  s.done.clear();  // batches not taken, freed here (host memory only)
}

size_t Prefetcher::size() const { return state_->plan.size(); }

BatchPtr Prefetcher::next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const size_t b = s.next_to_take;
  s.ready.wait(lock, [&] { return s.done.count(b) > 0; });
  State::Slot slot = std::move(s.done.at(b));
  s.done.erase(b);
  ++s.next_to_take;
  lock.unlock();
  s.room.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

}  // namespace kiln
