#include "data/sampled_batches.hpp"

#include <chrono>
#include <stdexcept>
#include <vector>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include "device/batch_mover.hpp"
#include "plugin/host_objects.hpp"
#include "data/data_workers.hpp"
#include "data/prefetcher.hpp"
#include "profiling/profiler.hpp"
#include "data/sample_seed.hpp"
#include "data/sampler.hpp"

namespace kiln {

namespace {

SamplerOptions sampler_options(const SamplingSettings& s, kiln_split split, const EpochSpec& spec, int64_t length) {
  SamplerOptions options;
  options.seed = s.seed;
  options.shuffle = spec.shuffle;
  options.drop_last = split == KILN_SPLIT_TRAIN && s.drop_last;
  options.batch_size = spec.batch_size;
  options.rank = s.rank;
  // predict is not sharded: rank 0 writes the whole split.
  options.world_size = split == KILN_SPLIT_PREDICT ? 1 : s.world_size;
  options.equal_shards = split == KILN_SPLIT_TRAIN;
  options.max_batches = spec.limit.apply(batches_in_shard(options, length));
  return options;
}

// One epoch of one split, as a run of segments, each fetched one way: on
// prefetch threads (a Prefetcher over the segment's batches) or inline. With
// a trial, the segments are its warm-up and windows, then the rest of the
// epoch; without, the epoch is one segment.
class Fetched final : public BatchStream {
 public:
  using Clock = std::chrono::steady_clock;

  Fetched(BatchRequest request, int threads, int depth, c10::Device device, FetchMode mode, FetchTrial* trial,
          Activity* activity)
      : mover_(std::make_shared<BatchMover>(device)),
        request_(std::move(request)),
        threads_(threads),
        depth_(depth),
        mode_(mode),
        trial_(trial),
        activity_(activity),
        size_(request_.plan->size()) {
    if (mover_->moves()) request_.prepare = [mover = mover_](kiln_batch& b) { mover->pin(b); };
  }
  int64_t size() const override { return static_cast<int64_t>(size_); }
  int64_t first_batch() const override { return request_.plan->first_batch; }
  int64_t position_after(int64_t batch) const override {
    return request_.plan->position_after(static_cast<size_t>(batch - request_.plan->first_batch));
  }
  std::vector<int64_t> sample_indices(int64_t batch) const override {
    const auto b = static_cast<size_t>(batch - request_.plan->first_batch);
    return std::vector<int64_t>(request_.plan->batch(b), request_.plan->batch(b) + request_.plan->batch_size(b));
  }
  BatchPtr next() override {
    if (!mover_->moves()) return fetch();
    if (!staged_) stage();
    BatchPtr batch = std::move(staged_);
    ProfileScope timed(request_.profiler.get(), Phase::host_to_device);
    mover_->finish(*batch);
    // The next batch's copy is issued now, before this batch's step, when
    // a prefetch thread already has it: it runs on the copy stream while the
    // GPU computes this one. Never by waiting for it: a slow or stuck
    // get_batch of the next batch must not hold back this batch's step (nor
    // a failure there, which must be reported while that call is stuck),
    // and an inline gather is better done once this step is queued.
    if (BatchPtr ready = try_fetch()) {
      staged_ = std::move(ready);
      mover_->start(*staged_);
    }
    return batch;
  }

 private:
  void stage() {
    staged_ = fetch();
    mover_->start(*staged_);
  }

  // The next batch without waiting, when a prefetch thread of the open
  // segment has it ready and no timing window is open (whose steps are
  // timed from one fetch to the next); else null, and fetch() takes it.
  BatchPtr try_fetch() {
    if (fetched_ >= size_ || fetched_ == segment_end_ || !prefetcher_ || timed_) return nullptr;
    BatchPtr batch = prefetcher_->try_next();
    if (batch) ++fetched_;
    return batch;
  }

  BatchPtr fetch() {
    if (fetched_ >= size_) throw std::logic_error("a batch stream was read past its last batch");
    if (fetched_ == segment_end_) open_segment();
    // A window times each step from the entry here to the next: the gather
    // (or the wait for the prefetch thread) and the step. Its first step
    // (the thread's start) and its last (whose gather is the next
    // segment's) are left out.
    if (timed_ && fetched_ > segment_begin_) {
      stamps_.push_back(Clock::now());
      if (fetched_ + 1 == segment_end_) end_window();
    }
    BatchPtr batch = prefetcher_ ? prefetcher_->next() : gather_inline(request_, fetched_, activity_);
    ++fetched_;
    return batch;
  }

  void open_segment() {
    prefetcher_.reset();  // all its batches taken: its threads have ended or are ending
    FetchTrial::Segment segment{mode_, size_ - fetched_, false};
    if (trial_ && trial_->running()) segment = trial_->next_segment(fetched_, size_ - fetched_);
    segment_begin_ = fetched_;
    segment_end_ = fetched_ + segment.length;
    segment_mode_ = segment.mode;
    timed_ = segment.timed;
    stamps_.clear();
    if (segment.mode == FetchMode::thread)
      prefetcher_.emplace(request_, segment_begin_, segment_end_, threads_, depth_);
  }

  void end_window() {
    std::vector<double> seconds;
    for (size_t i = 1; i < stamps_.size(); ++i)
      seconds.push_back(std::chrono::duration<double>(stamps_[i] - stamps_[i - 1]).count());
    timed_ = false;
    trial_->record(segment_mode_, seconds);
    if (!trial_->running()) spdlog::info("{}", trial_->verdict());
  }

  // Shared with the prefetch threads, which pin what they fetch.
  std::shared_ptr<BatchMover> mover_;
  BatchRequest request_;
  int threads_, depth_;
  FetchMode mode_;      // without a trial, or once it decided
  FetchTrial* trial_;   // null: none in this stream
  Activity* activity_;  // told when the main thread is inside get_batch
  size_t size_;
  size_t fetched_ = 0;  // batches fetched (taken from their segment)
  size_t segment_begin_ = 0, segment_end_ = 0;
  FetchMode segment_mode_ = FetchMode::thread;
  bool timed_ = false;
  std::vector<Clock::time_point> stamps_;
  std::optional<Prefetcher> prefetcher_;
  BatchPtr staged_;
};

}  // namespace

SampledBatches::SampledBatches(DataModuleProxy data, SamplingSettings settings, c10::Device device)
    : data_(data), settings_(settings), device_(device) {
  // On the CPU, intra-op threads that fill this rank's share of the cores
  // leave a worker thread none of its own: it would compete with the step's
  // OpenMP team (which then waits at each barrier for a descheduled
  // thread), so there is nothing to measure. Trying it anyway made mlp32's
  // steps 2-4x slower for the trial's windows, 0.03-0.1 s of a 0.27 s
  // epoch; a prefetch thread per rank for two one-thread ranks on 2 cores
  // cost mlp256 ~10 % (bench/README.md). Several processes share the cores
  // in ways one rank cannot time alone (each rank's trial would time the
  // others too): they go by the cores left over. One process with a core
  // left over runs the trial (data/fetch_trial.hpp). On a GPU the step only
  // queues work: `auto` keeps worker threads (data/data_workers.hpp).
  DataWorkersInput in;
  in.requested = settings_.data_workers;
  in.requested_depth = settings_.prefetch_batches;
  in.concurrent = (data_.instance().plugin().descriptor->flags & KILN_DATA_CONCURRENT_GET_BATCH) != 0;
  in.on_gpu = !device_.is_cpu();
  in.intra_op_threads = at::get_num_threads();
  in.cores = settings_.cores > 0 ? settings_.cores : usable_cores();
  in.world_size = static_cast<int>(settings_.world_size);
  in.data_id = data_.instance().id();
  const DataWorkersPlan plan = plan_data_workers(in);
  if (!plan.log.empty() && settings_.rank == 0) spdlog::info("{}", plan.log);
  threads_ = plan.threads;
  depth_ = plan.depth;
  switch (plan.kind) {
    case DataWorkersPlan::Kind::threads: fixed_ = FetchMode::thread; break;
    case DataWorkersPlan::Kind::inline_: fixed_ = FetchMode::inline_; break;
    case DataWorkersPlan::Kind::trial: trial_.emplace(FetchMode::thread, settings_.trial); break;
  }
}

BatchPtr SampledBatches::sample(kiln_split asked, size_t count) {
  const kiln_split split = source(asked);
  const int64_t n = std::min<int64_t>(length(split), static_cast<int64_t>(count));
  if (n <= 0) return nullptr;
  BatchPlan plan;
  for (int64_t i = 0; i < n; ++i) plan.indices.push_back(i);
  plan.offsets = {0, static_cast<size_t>(n)};
  plan.positions = {n};
  plan.seed_key = sample_seed_key(settings_.seed, split, 0);
  plan.for_check = true;
  return gather_inline(BatchRequest{data_.instance(), split, std::make_shared<const BatchPlan>(std::move(plan)), {}, {}},
                       0, data_.activity());
}

FetchMode SampledBatches::mode() const { return trial_ ? trial_->mode() : fixed_; }

int64_t SampledBatches::batches_per_epoch(kiln_split split, const EpochSpec& spec) {
  return sampler_options(settings_, source(split), spec, length(split)).max_batches;
}

std::unique_ptr<BatchStream> SampledBatches::open(kiln_split asked, const EpochSpec& spec, int64_t epoch,
                                                  int64_t first_sample) {
  // Overfitting validates on the training split's batches: the same
  // sampling, and the per-sample seeds of the training split's epoch.
  const kiln_split split = source(asked);
  const int64_t n = length(split);
  SamplerOptions options = sampler_options(settings_, split, spec, n);
  options.first_sample = first_sample;  // a resumed epoch continues where it stopped
  // A position that is not a whole number of this run's steps was reached by
  // a run of another shape too (one that itself continued a checkpoint of
  // another shape, then saved again): it continues the same unpadded way.
  const int64_t step_samples = spec.batch_size * std::max<int64_t>(options.world_size, 1);
  options.saved_elsewhere = split == KILN_SPLIT_TRAIN &&
                            (epoch == saved_elsewhere_epoch_ || (first_sample > 0 && first_sample % step_samples != 0));
  BatchPlan plan = plan_epoch(options, epoch, n, orders_);
  plan.epoch = epoch;
  plan.seed_key = sample_seed_key(settings_.seed, split, epoch);
  if (split == KILN_SPLIT_TRAIN && epoch == 0 && plan.indices.size() >= 5)
    spdlog::debug("epoch 0 order starts {} {} {} {} {}", plan.indices[0], plan.indices[1], plan.indices[2],
                  plan.indices[3], plan.indices[4]);
  // Only training runs the trial: its steps are the ones that repeat.
  FetchTrial* trial = split == KILN_SPLIT_TRAIN && trial_ && trial_->running() ? &*trial_ : nullptr;
  return std::make_unique<Fetched>(
      BatchRequest{data_.instance(), split, std::make_shared<const BatchPlan>(std::move(plan)), {}, profiler_}, threads_,
      depth_, device_, mode(), trial, data_.activity());
}

}  // namespace kiln
