#include "data/prefetcher.hpp"

#include "profiling/profiler.hpp"

#include <algorithm>
#include <string>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <cstdint>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include "data/sample_seed.hpp"
#include "util/activity.hpp"

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

bool serialized(const PluginInstance::KeepAlive& keep) {
  return (keep.descriptor->flags & KILN_DATA_CONCURRENT_GET_BATCH) == 0;
}

// The call itself, counted in flight (so cleanup can tell a call is running).
kiln_error* call_get_batch(const PluginInstance::KeepAlive& keep, kiln_split split, const BatchPlan& plan, size_t b,
                           kiln_batch** out) {
  const auto& hooks = *static_cast<const kiln_data_hooks*>(keep.descriptor->hooks);
  std::unique_lock<std::mutex> call_lock(*keep.serial, std::defer_lock);
  if (serialized(keep)) call_lock.lock();
  const int64_t* indices = plan.batch(b);
  const size_t count = plan.batch_size(b);
  // A 1.4 data module gets the epoch and a seed per sample (ABI 1.4).
  const bool seeded = KILN_HAS_FIELD(&hooks, kiln_data_hooks, get_batch_seeded) && hooks.get_batch_seeded != nullptr;
  std::vector<uint64_t> seeds;
  if (seeded) {
    seeds.resize(count);
    for (size_t i = 0; i < count; ++i) seeds[i] = sample_seed(plan.seed_key, indices[i]);
  }
  keep.in_flight->fetch_add(1);
  kiln_error* error;
  if (seeded) {
    const kiln_batch_request request{sizeof(kiln_batch_request), split,      indices, count, seeds.data(),
                                     plan.epoch,                 plan.for_check ? 1 : 0};
    error = hooks.get_batch_seeded(keep.instance, &request, out);
  } else {
    error = hooks.get_batch(keep.instance, split, indices, count, out);
  }
  keep.in_flight->fetch_sub(1);
  return error;
}

// A call's result as the loop takes it: the error (HookError naming the data
// module) or the batch, prepared.
// Which batch failed, for the error's one line: its number in the epoch and
// its first samples.
std::string which_batch(const BatchPlan& plan, size_t b) {
  std::string text = " (batch " + std::to_string(plan.first_batch + static_cast<int64_t>(b)) + " of the epoch: sample";
  const size_t n = plan.batch_size(b);
  text += n == 1 ? " " : "s ";
  for (size_t i = 0; i < std::min<size_t>(n, 4); ++i) text += (i ? ", " : "") + std::to_string(plan.batch(b)[i]);
  return text + (n > 4 ? ", ...)" : ")");
}

BatchPtr accept(const BatchRequest& request, size_t b, kiln_error* error, kiln_batch* out) {
  BatchPtr batch(out);
  if (error != nullptr) request.data.check(error, "get_batch", which_batch(*request.plan, b));
  if (!batch) request.data.check(make_error("get_batch returned no batch"), "get_batch");
  if (request.prepare) request.prepare(*batch);
  return batch;
}

}  // namespace

BatchPtr gather_inline(const BatchRequest& request, size_t b, Activity* activity) {
  const PluginInstance::KeepAlive keep = request.data.keep_alive();
  kiln_batch* out = nullptr;
  kiln_error* error;
  {
    InHook in(activity, "get_batch");
    error = call_get_batch(keep, request.split, *request.plan, b, &out);
  }
  return accept(request, b, error, out);
}

struct Prefetcher::State {
  struct Slot {
    BatchPtr batch;
    std::exception_ptr error;
    bool ready = false;
  };

  State(BatchRequest request, size_t first, size_t last, size_t depth)
      : request(std::move(request)),
        keep(this->request.data.keep_alive()),
        first(std::min(first, this->request.plan->size())),
        last(std::clamp(last, this->first, this->request.plan->size())),
        depth(depth),
        low_water(depth / 2),
        ring(depth),
        next_to_claim(this->first),
        next_to_take(this->first) {}

  const BatchRequest request;  // its PluginInstance is not to be touched once abandoned
  const PluginInstance::KeepAlive keep;
  const size_t first, last;
  const size_t depth;
  // Workers that found the ring full sleep until only this many batches are
  // in flight, then refill it in one go: the consumer wakes them once every
  // depth - low_water batches, not after every batch it takes (a wake-up is
  // a system call, and on a busy machine a context switch, per step).
  const size_t low_water;

  std::mutex mutex;
  std::condition_variable ready_cv, room_cv, exited_cv;
  std::vector<Slot> ring;  // batch b in ring[(b - first) % depth]
  size_t next_to_claim, next_to_take;
  int sleeping = 0;               // workers waiting for room
  bool consumer_waiting = false;  // the main thread waits for a batch
  bool stopping = false;
  bool abandoned = false;  // the owner is gone: drop results, touch nothing of the plugin's
  int running = 0;

  Slot& slot(size_t b) { return ring[(b - first) % depth]; }
  void work();
};

void Prefetcher::State::work() {
  use_one_intra_op_thread();
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lock(mutex);
      while (!(stopping || next_to_claim >= last || next_to_claim < next_to_take + depth)) {
        ++sleeping;
        room_cv.wait(lock);
        --sleeping;
      }
      if (stopping || next_to_claim >= last) break;
      b = next_to_claim++;
    }
    kiln_batch* out = nullptr;
    const auto called = request.profiler ? Profiler::Clock::now() : Profiler::Clock::time_point{};
    kiln_error* error = call_get_batch(keep, request.split, *request.plan, b, &out);
    if (request.profiler) request.profiler->worker_event("get_batch", called, Profiler::Clock::now());
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (abandoned) {
        // Nobody will take it, and the PluginInstance may be gone.
        (void)take_error(error);
        BatchPtr(out).reset();
        break;
      }
    }
    Slot done;
    try {
      done.batch = accept(request, b, error, out);
    } catch (...) {
      done.error = std::current_exception();
    }
    done.ready = true;
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mutex);
      slot(b) = std::move(done);
      wake = consumer_waiting;
    }
    if (wake) ready_cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(mutex);
  --running;
  exited_cv.notify_all();
}

Prefetcher::Prefetcher(BatchRequest request, size_t first, size_t last, int threads, int depth)
    : state_(std::make_shared<State>(std::move(request), first, last, static_cast<size_t>(std::max(1, depth)))),
      uncaught_at_construction_(std::uncaught_exceptions()) {
  const size_t batches = state_->last - state_->first;
  const int count = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(batches, 1))));
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
  s.room_cv.notify_all();
  // A normal end waits for calls in flight, however slow; an end by an
  // exception (a failed step, an interruption) waits a bounded time, so the
  // error is reported and cleanup begins even if get_batch is stuck.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_construction_;
  if (!unwinding) {
    s.exited_cv.wait(lock, [&] { return s.running == 0; });
  } else if (!s.exited_cv.wait_for(lock, kAbandonAfter, [&] { return s.running == 0; })) {
    s.abandoned = true;
    spdlog::warn("data module '{}': get_batch has not returned for {} s after the run failed; its prefetch "
                 "thread is abandoned (teardown may run while it is still inside get_batch)",
                 s.request.data.id(), kAbandonAfter.count());
  }
  for (auto& slot : s.ring) slot = State::Slot{};  // batches not taken, freed here (host memory only)
}

size_t Prefetcher::size() const { return state_->last - state_->first; }

BatchPtr Prefetcher::next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const size_t b = s.next_to_take;
  if (b >= s.last) throw std::logic_error("Prefetcher::next past its last batch");
  State::Slot& slot = s.slot(b);
  if (!slot.ready) {
    s.consumer_waiting = true;
    s.ready_cv.wait(lock, [&] { return slot.ready; });
    s.consumer_waiting = false;
  }
  State::Slot taken = std::move(slot);
  slot = State::Slot{};
  ++s.next_to_take;
  const bool wake = s.sleeping > 0 && s.next_to_claim - s.next_to_take <= s.low_water;
  lock.unlock();
  if (wake) s.room_cv.notify_all();
  if (taken.error) std::rethrow_exception(taken.error);
  return std::move(taken.batch);
}

BatchPtr Prefetcher::try_next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const size_t b = s.next_to_take;
  if (b >= s.last) return nullptr;
  State::Slot& slot = s.slot(b);
  if (!slot.ready || slot.error) return nullptr;
  BatchPtr taken = std::move(slot.batch);
  slot = State::Slot{};
  ++s.next_to_take;
  const bool wake = s.sleeping > 0 && s.next_to_claim - s.next_to_take <= s.low_water;
  lock.unlock();
  if (wake) s.room_cv.notify_all();
  return taken;
}

}  // namespace kiln
