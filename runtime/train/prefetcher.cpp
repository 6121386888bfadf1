#include "train/prefetcher.hpp"

#include <algorithm>

#include <ATen/Parallel.h>

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

Prefetcher::Prefetcher(const PluginInstance& data, kiln_split split, BatchPlan plan, int threads, int depth)
    : data_(data),
      split_(split),
      plan_(std::move(plan)),
      depth_(static_cast<size_t>(std::max(1, depth))),
      serialize_((data.plugin().descriptor->flags & KILN_DATA_CONCURRENT_GET_BATCH) == 0) {
  const int count = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(plan_.size(), 1))));
  for (int i = 0; i < count; ++i) workers_.emplace_back([this] { work(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  room_.notify_all();
  ready_.notify_all();
  for (auto& w : workers_) w.join();
}

void Prefetcher::work() {
  use_one_intra_op_thread();
  const auto& hooks = data_.plugin().data_hooks();
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      room_.wait(lock, [&] { return stopping_ || next_to_claim_ >= plan_.size() || next_to_claim_ < next_to_take_ + depth_; });
      if (stopping_ || next_to_claim_ >= plan_.size()) return;
      b = next_to_claim_++;
    }
    Slot slot;
    try {
      kiln_batch* out = nullptr;
      kiln_error* error;
      {
        std::unique_lock<std::mutex> call_lock(call_mutex_, std::defer_lock);
        if (serialize_) call_lock.lock();
        error = hooks.get_batch(data_.instance(), split_, plan_.batch(b), plan_.batch_size(b), &out);
      }
      data_.check(error, "get_batch");
      if (out == nullptr) data_.check(make_error("get_batch returned no batch"), "get_batch");
      slot.batch.reset(out);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.emplace(b, std::move(slot));
    }
    ready_.notify_all();
  }
}

BatchPtr Prefetcher::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  const size_t b = next_to_take_;
  ready_.wait(lock, [&] { return done_.count(b) > 0; });
  Slot slot = std::move(done_.at(b));
  done_.erase(b);
  ++next_to_take_;
  lock.unlock();
  room_.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

}  // namespace kiln
