// RecordFunction's layout has a field only builds without NDEBUG have;
// LibTorch is built with it, so this file is too, whatever the build type.
#ifndef NDEBUG
#define NDEBUG
#endif

#include "optim/sharded_parameters.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include "distributed/process_group.hpp"
#include "profiling/profiler.hpp"
#include "util/errors.hpp"

namespace kiln {

struct ShardedParameters::Space {
  std::vector<at::Tensor> params;
  ShardLayout layout;
  at::TensorOptions options;
  at::Tensor shard;              // this rank's elements, padding included
  std::vector<at::Tensor> flat;  // each parameter's storage as a 1-D tensor of its own (no version counter shared)
};

namespace {

// RecordFunction takes plain function pointers: the one ShardedParameters
// being read through is found here. One run, one at a time (Active checks).
std::atomic<ShardedParameters*> reading{nullptr};

// The buckets an operator pinned, unpinned when it ends.
struct Pinned final : at::ObserverContext {
  explicit Pinned(std::vector<size_t> b) : buckets(std::move(b)) {}
  std::vector<size_t> buckets;
};

void storages_of(const c10::IValue& value, std::vector<const c10::StorageImpl*>& out) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (t.defined() && t.has_storage()) out.push_back(t.storage().unsafeGetStorageImpl());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) storages_of(element, out);
  }
}

c10::Allocator* allocator_of(c10::StorageImpl& storage, c10::Device device) {
  c10::Allocator* allocator = storage.allocator();
  return allocator ? allocator : c10::GetAllocator(device.type());
}

}  // namespace

// The callbacks, friends of ShardedParameters.
struct ReadCallbacks {
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    ShardedParameters* parameters = reading.load(std::memory_order_acquire);
    if (!parameters) return nullptr;
    std::vector<const c10::StorageImpl*> storages;
    for (const c10::IValue& input : fn.inputs()) storages_of(input, storages);
    if (storages.empty()) return nullptr;
    std::vector<size_t> pinned = parameters->read(storages);
    if (pinned.empty()) return nullptr;
    return std::make_unique<Pinned>(std::move(pinned));
  }
  static void end(const at::RecordFunction&, at::ObserverContext* context) {
    ShardedParameters* parameters = reading.load(std::memory_order_acquire);
    if (parameters && context) parameters->unpin(static_cast<Pinned*>(context)->buckets);
  }
};

ShardedParameters::ShardedParameters(const std::vector<at::Tensor>& trainable, const ShardLayout& trainable_layout,
                                     const std::vector<at::Tensor>& frozen, ProcessGroup* group, int64_t bucket_bytes,
                                     bool prefetch)
    : group_(group), prefetch_(prefetch) {
  std::vector<int64_t> frozen_numels;
  for (const auto& p : frozen) frozen_numels.push_back(p.numel());
  const std::vector<std::pair<const std::vector<at::Tensor>*, ShardLayout>> lists{
      {&trainable, trainable_layout},
      {&frozen, ShardLayout(frozen_numels, trainable_layout.world_size(), trainable_layout.rank())}};
  int64_t largest = 0;
  for (const auto& [params, layout] : lists) {
    if (params->empty()) continue;
    auto space = std::make_unique<Space>(Space{*params, layout, (*params)[0].options().requires_grad(false), {}, {}});
    const char* which = params == &trainable ? "trained" : "frozen";
    for (size_t i = 0; i < params->size(); ++i) {
      const at::Tensor& p = (*params)[i];
      const bool alone = p.is_contiguous() && p.storage_offset() == 0 &&
                         p.storage().nbytes() == static_cast<size_t>(p.numel()) * p.element_size();
      if (p.scalar_type() != space->options.dtype().toScalarType() || p.device() != space->options.device() || !alone)
        throw InputError(std::string("distributed.shard = \"parameters\" shards parameters that each own their "
                                     "memory, one dtype and device for the ") +
                         which + " ones; " + which + " parameter " + std::to_string(i) + " is " +
                         std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() +
                         (alone ? "" : ", a view into memory it shares") +
                         " (use distributed.shard = \"gradients\")");
      at::Tensor flat = at::empty({0}, space->options);
      flat.set_(p.storage(), 0, {p.numel()}, {1});
      space->flat.push_back(flat);
    }
    space->shard = at::zeros({layout.shard_size()}, space->options);
    // Consecutive parameters of about bucket_bytes, at least one each.
    const int space_index = static_cast<int>(spaces_.size());
    for (size_t i = 0; i < params->size(); ++i) {
      const int64_t bytes = (*params)[i].numel() * static_cast<int64_t>((*params)[i].element_size());
      if (buckets_.empty() || buckets_.back().space != space_index || buckets_.back().bytes + bytes > bucket_bytes) {
        Bucket bucket;
        bucket.space = space_index;
        bucket.first = bucket.last = i;
        buckets_.push_back(std::move(bucket));
      }
      Bucket& b = buckets_.back();
      b.last = i + 1;
      b.bytes += bytes;
      largest = std::max(largest, b.bytes);
      bucket_of_[(*params)[i].storage().unsafeGetStorageImpl()] = buckets_.size() - 1;
    }
    spaces_.push_back(std::move(space));
  }
  budget_bytes_ = 2 * bucket_bytes;
  for (const Bucket& b : buckets_) stats_.whole_bytes += b.bytes;
  stats_.total_bytes = stats_.whole_bytes;
  arrived_.assign(buckets_.size(), 1);
  if (group_ && trainable_layout.world_size() > 1) gatherer_ = std::thread([this] { gathering_thread(); });
}

ShardedParameters::~ShardedParameters() {
  ShardedParameters* self = this;
  reading.compare_exchange_strong(self, nullptr);
  if (gatherer_.joinable()) {
    {
      // What is queued is dropped (a run that ends with gathers queued has
      // failed); the gather under way ends, or fails when the peers leave.
      std::lock_guard lock(queue_mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    gatherer_.join();
  }
}

void ShardedParameters::gathering_thread() {
  for (;;) {
    size_t bucket = 0;
    bool failed = false;
    {
      std::unique_lock lock(queue_mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      bucket = queue_.front();
      queue_.pop_front();
      failed = static_cast<bool>(failure_);
    }
    {
      at::NoGradGuard no_grad;
      at::RecordFunctionGuard quiet(false);
      if (!failed) {
        try {
          transfer(bucket);
        } catch (...) {
          failed = true;
          std::lock_guard lock(queue_mutex_);
          if (!failure_) failure_ = std::current_exception();
        }
      }
      // Nothing computed from a failed gather counts (check() says so), and
      // NaN makes sure of it.
      if (failed) fill_nan(bucket);
    }
    {
      std::lock_guard lock(queue_mutex_);
      arrived_[bucket] = 1;
    }
    arrived_cv_.notify_all();
  }
}

std::vector<at::Tensor> ShardedParameters::owned_views() const {
  std::vector<at::Tensor> out;
  if (spaces_.empty() || spaces_[0]->params.empty()) return out;
  const Space& s = *spaces_[0];
  for (size_t i = 0; i < s.params.size(); ++i) {
    const ShardLayout::Run run = s.layout.owned(i);
    at::Tensor view = s.shard.detach().narrow(0, run.length ? s.layout.position_in_shard(i) : 0, run.length);
    view.set_requires_grad(true);
    out.push_back(view);
  }
  return out;
}

void ShardedParameters::shard() {
  std::lock_guard lock(mutex_);
  at::NoGradGuard no_grad;
  at::RecordFunctionGuard quiet(false);
  const bool broadcast = group_ && group_->world_size() > 1;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Space& s = *spaces_[buckets_[b].space];
    if (broadcast) {
      // Rank 0's values, one bucket at a time: a rank whose plugin left
      // the weights unread (kiln_exported maps them from its archive) reads
      // none but its own, and never holds more than a bucket whole.
      std::vector<at::Tensor> values(s.flat.begin() + static_cast<std::ptrdiff_t>(buckets_[b].first),
                                     s.flat.begin() + static_cast<std::ptrdiff_t>(buckets_[b].last));
      group_->broadcast(values, 0);
    }
    for (size_t i = buckets_[b].first; i < buckets_[b].last; ++i) {
      const ShardLayout::Run run = s.layout.owned(i);
      if (run.length > 0)
        s.shard.narrow(0, s.layout.position_in_shard(i), run.length).copy_(s.flat[i].narrow(0, run.begin, run.length));
    }
    free(b);
  }
  sharded_ = true;
  stats_.peak_whole_bytes = 0;
}

void ShardedParameters::round_into_shard(const std::vector<at::Tensor>& masters) {
  at::NoGradGuard no_grad;
  at::RecordFunctionGuard quiet(false);
  if (owned_.empty()) owned_ = owned_views();  // made once: the shard is never reallocated
  for (size_t i = 0; i < owned_.size() && i < masters.size(); ++i)
    if (owned_[i].numel() > 0) owned_[i].detach().copy_(masters[i]);
}

ShardedParameters::Active::Active(ShardedParameters& parameters) : parameters_(parameters) {
  ShardedParameters* none = nullptr;
  if (!reading.compare_exchange_strong(none, &parameters))
    throw std::logic_error("two sharded parameter sets read at once");
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&ReadCallbacks::start, &ReadCallbacks::end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

ShardedParameters::Active::~Active() {
  at::removeCallback(handle_);
  ShardedParameters* self = &parameters_;
  reading.compare_exchange_strong(self, nullptr);
}

std::vector<size_t> ShardedParameters::read(const std::vector<const c10::StorageImpl*>& storages) {
  std::vector<size_t> out;
  std::lock_guard lock(mutex_);
  if (!sharded_) return out;
  for (const c10::StorageImpl* s : storages) {
    const auto it = bucket_of_.find(s);
    if (it != bucket_of_.end() && std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  if (out.empty()) return out;
  const bool training = at::GradMode::is_enabled();  // what kind of pass this is, if it starts here
  // What this does dispatches operators too: not read again.
  at::RecordFunctionGuard quiet(false);
  at::NoGradGuard no_grad;
  int64_t needed = 0;
  for (size_t b : out) {
    ++buckets_[b].pins;
    buckets_[b].used = ++clock_;
    if (!buckets_[b].whole) needed += buckets_[b].bytes;
  }
  make_room(needed);
  for (size_t b : out)
    if (!buckets_[b].whole) {
      request(b);
      buckets_[b].read = false;
    }
  bool first = false;
  for (size_t b : out)
    if (!buckets_[b].read) {
      first_read(b, training);
      first = true;
    }
  if (first && prefetch_) fetch_ahead(out);
  const auto start = std::chrono::steady_clock::now();
  bool waited_any = false;
  for (size_t b : out) waited_any = await(b) || waited_any;
  if (waited_any) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats_.waiting_s += waited;
    // From the loop's thread, or (a GPU's backward) the autograd thread the
    // loop's waits on meanwhile: never two at once.
    if (profiler_) profiler_->carve(Phase::gather_wait, waited, 1);
  }
  return out;
}

void ShardedParameters::make_room(int64_t needed) {
  while (!hold_all_ && stats_.whole_bytes + needed > budget_bytes_) {
    size_t oldest = buckets_.size();
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (buckets_[b].whole && buckets_[b].read && buckets_[b].pins == 0 &&
          (oldest == buckets_.size() || buckets_[b].used < buckets_[oldest].used))
        oldest = b;
    if (oldest == buckets_.size()) break;
    await(oldest);
    free(oldest);
  }
}

void ShardedParameters::first_read(size_t bucket, bool training) {
  buckets_[bucket].read = true;
  if (pass_kind_ < 0) {
    pass_kind_ = training ? 1 : 0;
    position_ = 0;
  }
  pass_.push_back(bucket);
  // Where the last pass of this kind read it, and what it read next.
  const std::vector<size_t>& last = last_pass_[pass_kind_];
  if (position_ < last.size() && last[position_] != bucket) {
    const auto it = std::find(last.begin() + static_cast<std::ptrdiff_t>(position_), last.end(), bucket);
    position_ = it == last.end() ? last.size() : static_cast<size_t>(it - last.begin());
  }
  if (position_ < last.size()) ++position_;
}

void ShardedParameters::fetch_ahead(const std::vector<size_t>& reading) {
  const std::vector<size_t>& last = last_pass_[pass_kind_];
  // The next one not whole now: one still whole from before is read as it
  // is, and one fetched ahead and not yet read is the one bucket ahead.
  size_t next = buckets_.size();
  for (size_t i = position_; i < last.size() && i < position_ + 4 && next == buckets_.size(); ++i) {
    const Bucket& b = buckets_[last[i]];
    if (b.whole && !b.read) return;
    if (!b.whole) next = last[i];
  }
  if (next == buckets_.size() || std::find(reading.begin(), reading.end(), next) != reading.end()) return;
  make_room(buckets_[next].bytes);  // on its way, it may pass the budget by itself
  request(next);
  buckets_[next].read = false;
  ++stats_.prefetched;
}

void ShardedParameters::end_pass() {
  if (pass_kind_ >= 0) last_pass_[pass_kind_] = std::move(pass_);
  pass_.clear();
  pass_kind_ = -1;
  position_ = 0;
}

void ShardedParameters::unpin(const std::vector<size_t>& buckets) {
  std::lock_guard lock(mutex_);
  for (size_t b : buckets) --buckets_[b].pins;
}

void ShardedParameters::allocate(size_t bucket) {
  Bucket& b = buckets_[bucket];
  Space& s = *spaces_[b.space];
  b.versions.clear();
  for (size_t i = b.first; i < b.last; ++i) {
    const at::Tensor& p = s.params[i];
    c10::StorageImpl& storage = *p.storage().unsafeGetStorageImpl();
    const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
    at::DataPtr memory = take_spare(bytes, p.device());
    if (!memory) {
      memory = allocator_of(storage, p.device())->allocate(bytes);
      ++stats_.allocations;
    }
    storage.set_data_ptr_noswap(std::move(memory));
    storage.set_nbytes(bytes);
    b.versions.push_back(p._version());
  }
  b.whole = true;
  stats_.whole_bytes += b.bytes;
}

void ShardedParameters::request(size_t bucket) {
  allocate(bucket);
  if (!hold_all_) stats_.peak_whole_bytes = std::max(stats_.peak_whole_bytes, stats_.whole_bytes);
  ++stats_.gathers;
  if (!gatherer_.joinable()) {  // one process: a copy from its own shard
    transfer(bucket);
    return;
  }
  {
    std::lock_guard lock(queue_mutex_);
    arrived_[bucket] = 0;
    queue_.push_back(bucket);
  }
  queued_.notify_one();
}

bool ShardedParameters::await(size_t bucket) {
  if (!gatherer_.joinable()) return false;
  std::unique_lock lock(queue_mutex_);
  if (arrived_[bucket]) return false;
  arrived_cv_.wait(lock, [&] { return arrived_[bucket] != 0; });
  return true;
}

void ShardedParameters::transfer(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  Space& s = *spaces_[b.space];
  const ShardLayout& layout = s.layout;
  const int64_t begin = layout.offset(b.first);
  const int64_t count = layout.offset(b.last - 1) + layout.numel(b.last - 1) - begin;
  // Values for the flat range [first, first + n) into the parameters there.
  auto take = [&](int64_t first, const at::Tensor& values) {
    const int64_t end = first + values.numel();
    for (size_t i = b.first; i < b.last; ++i) {
      const int64_t lo = std::max(first, layout.offset(i)), hi = std::min(end, layout.offset(i) + layout.numel(i));
      if (hi > lo) s.flat[i].narrow(0, lo - layout.offset(i), hi - lo).copy_(values.narrow(0, lo - first, hi - lo));
    }
  };
  const int64_t mine = layout.rank() * layout.shard_size();
  auto give = [&](int64_t first, at::Tensor& place) { place.copy_(s.shard.narrow(0, first - mine, place.numel())); };
  if (group_ && layout.world_size() > 1)
    group_->gather_range(begin, count, layout.shard_size(), s.options, give, take, "its part of the parameters");
  else
    take(begin, s.shard.narrow(0, begin, count));
}

void ShardedParameters::free(size_t bucket) {
  Bucket& b = buckets_[bucket];
  Space& s = *spaces_[b.space];
  for (size_t i = b.first; i < b.last && !written_; ++i)
    if (i - b.first < b.versions.size() && s.params[i]._version() != b.versions[i - b.first])
      written_ = std::string("something wrote into ") + (b.space == 0 ? "trained" : "frozen") + " parameter " +
                 std::to_string(i) + " while it was gathered whole (an in-place operation in a plugin's hook?); "
                 "with distributed.shard = \"parameters\" each rank keeps only its part, so the write would be lost "
                 "(change weights only through the optimizer, or use distributed.shard = \"gradients\")";
  for (size_t i = b.first; i < b.last; ++i) {
    c10::StorageImpl& storage = *s.params[i].storage().unsafeGetStorageImpl();
    const size_t bytes = storage.nbytes();
    at::DataPtr memory = storage.set_data_ptr(at::DataPtr(nullptr, s.params[i].device()));
    storage.set_nbytes(0);
    // Kept while whole and spare stay within the most ever whole at once
    // (a commit's gather_all excepted: then it goes back).
    if (memory && bytes > 0 && stats_.whole_bytes + spare_bytes_ <= stats_.peak_whole_bytes) {
      spare_bytes_ += static_cast<int64_t>(bytes);
      spare_.push_back(Spare{std::move(memory), bytes});
    }
  }
  b.whole = false;
  stats_.whole_bytes -= b.bytes;
}

at::DataPtr ShardedParameters::take_spare(size_t bytes, c10::Device device) {
  for (size_t i = spare_.size(); i-- > 0;)
    if (spare_[i].bytes == bytes && spare_[i].memory.device() == device) {
      at::DataPtr memory = std::move(spare_[i].memory);
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
      spare_bytes_ -= static_cast<int64_t>(bytes);
      return memory;
    }
  // None of its size: memory of its own, and what is spare beyond the most
  // ever whole, with it, goes back (the oldest first).
  while (!spare_.empty() &&
         stats_.whole_bytes + spare_bytes_ + static_cast<int64_t>(bytes) > stats_.peak_whole_bytes) {
    spare_bytes_ -= static_cast<int64_t>(spare_.front().bytes);
    spare_.erase(spare_.begin());
  }
  return at::DataPtr(nullptr, device);
}

void ShardedParameters::fill_nan(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  for (size_t i = b.first; i < b.last; ++i) spaces_[b.space]->flat[i].fill_(std::numeric_limits<double>::quiet_NaN());
}

void ShardedParameters::release_all() {
  std::lock_guard lock(mutex_);
  hold_all_ = false;
  if (!sharded_) return;
  end_pass();
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].whole && buckets_[b].pins == 0) {
      await(b);
      free(b);
    }
}

void ShardedParameters::check() const {
  std::lock_guard lock(mutex_);
  std::exception_ptr failure;
  {
    std::lock_guard queue(queue_mutex_);
    failure = failure_;
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const PeerFailure&) {
      throw;
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      throw PeerFailure(std::string("gathering sharded parameters failed (another rank failed or stopped "
                                    "responding): ") + one_line(e.what()));
    }
  }
  if (written_) throw std::runtime_error(*written_);
}

void ShardedParameters::gather_all(bool keep) {
  std::lock_guard lock(mutex_);
  if (!sharded_) return;
  at::RecordFunctionGuard quiet(false);
  at::NoGradGuard no_grad;
  hold_all_ = true;  // outside the budget and the peak
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].whole) {
      request(b);
      buckets_[b].read = true;  // outside any pass
      stats_.commit_whole_bytes = std::max(stats_.commit_whole_bytes, stats_.whole_bytes);
      if (!keep) {
        await(b);
        free(b);
      }
    }
  for (size_t b = 0; b < buckets_.size(); ++b) await(b);
  hold_all_ = keep;
}

int64_t ShardedParameters::most_batches(int64_t mine) {
  if (!group_ || group_->world_size() == 1) return mine;
  at::Tensor counts = at::zeros({group_->world_size()}, at::kDouble);
  counts[group_->rank()] = static_cast<double>(mine);
  group_->all_reduce_sum(counts, "its number of evaluation batches");
  return static_cast<int64_t>(counts.max().item<double>());
}

ShardedParameters::Stats ShardedParameters::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace kiln
