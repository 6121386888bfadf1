#include "train/sampled_batches.hpp"

#include <spdlog/spdlog.h>

#include "device/batch_mover.hpp"
#include "plugin/host_objects.hpp"
#include "train/prefetcher.hpp"
#include "train/sampler.hpp"

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

class Prefetched final : public BatchStream {
 public:
  Prefetched(const PluginInstance& data, kiln_split split, BatchPlan plan, const SamplingSettings& s,
             c10::Device device)
      : mover_(std::make_shared<BatchMover>(device)),
        prefetcher_(data, split, std::move(plan), s.prefetch_threads, s.prefetch_depth,
                    mover_->moves() ? [mover = mover_](kiln_batch& b) { mover->pin(b); }
                                    : std::function<void(kiln_batch&)>()),
        left_(static_cast<int64_t>(prefetcher_.size())) {}
  int64_t size() const override { return static_cast<int64_t>(prefetcher_.size()); }
  BatchPtr next() override {
    --left_;
    if (!mover_->moves()) return prefetcher_.next();
    if (!staged_) stage();
    BatchPtr batch = std::move(staged_);
    mover_->finish(*batch);
    // The next batch's copy is issued now, before this batch's step: it runs
    // on the copy stream while the GPU computes this one.
    if (left_ > 0) stage();
    return batch;
  }

 private:
  void stage() {
    staged_ = prefetcher_.next();
    mover_->start(*staged_);
  }

  // Shared with the prefetch threads, which pin what they fetch.
  std::shared_ptr<BatchMover> mover_;
  Prefetcher prefetcher_;
  int64_t left_;  // batches not yet taken
  BatchPtr staged_;
};

}  // namespace

int64_t SampledBatches::batches_per_epoch(kiln_split split, const EpochSpec& spec) {
  return sampler_options(settings_, split, spec, length(split)).max_batches;
}

std::unique_ptr<BatchStream> SampledBatches::open(kiln_split split, const EpochSpec& spec, int64_t epoch,
                                                  int64_t first_batch) {
  const int64_t n = length(split);
  BatchPlan plan = plan_epoch(sampler_options(settings_, split, spec, n), epoch, n, orders_);
  plan.drop_front(static_cast<size_t>(first_batch));  // a resumed epoch continues where it stopped
  if (split == KILN_SPLIT_TRAIN && epoch == 0 && plan.indices.size() >= 5)
    spdlog::debug("epoch 0 order starts {} {} {} {} {}", plan.indices[0], plan.indices[1], plan.indices[2],
                  plan.indices[3], plan.indices[4]);
  return std::make_unique<Prefetched>(data_.instance(), split, std::move(plan), settings_, device_);
}

}  // namespace kiln
