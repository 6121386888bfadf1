// Host-owned sampling: which samples form which batch, in which order.
// The order of epoch e is the (e+1)-th randperm drawn from one CPU generator
// seeded with the run's seed — a pure function of (seed, epoch, length), so a
// resumed run and every rank see the same order, and it matches a plain
// LibTorch loop that draws one randperm per epoch from a generator seeded the
// same way. Data modules never see a generator or a device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kiln {

// Sample indices of one epoch (this rank's shard), cut into batches.
struct BatchPlan {
  std::vector<int64_t> indices;  // concatenated batches
  std::vector<size_t> offsets;   // batch b is indices[offsets[b] .. offsets[b+1])
  // The epoch's batch number of the plan's first batch: 0, or where a
  // resumed epoch continues (the loops number batches from the epoch's start).
  int64_t first_batch = 0;
  // Training plans: positions[b] is how far the epoch's global order is
  // trained once every rank has run batch b of the plan — what a checkpoint
  // after it records (SamplerOptions::first_sample of the run resuming it).
  std::vector<int64_t> positions;
  // What kiln_batch_request carries besides the indices: the epoch (0 for
  // evaluation) and the key its per-sample seeds derive from
  // (data/sample_seed.hpp).
  int64_t epoch = 0;
  uint64_t seed_key = 0;
  // The sample the model's check_batch looks at (kiln_batch_request.for_check).
  bool for_check = false;
  int64_t position_after(size_t b) const { return positions.at(b); }
  size_t size() const { return offsets.empty() ? 0 : offsets.size() - 1; }
  const int64_t* batch(size_t b) const { return indices.data() + offsets[b]; }
  size_t batch_size(size_t b) const { return offsets[b + 1] - offsets[b]; }
};

struct SamplerOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  int64_t batch_size = 1;
  int64_t max_batches = -1;  // -1 = all
  // Sharding, as PyTorch's DistributedSampler: rank r takes every world-th
  // sample of the epoch's order, starting at r.
  int64_t rank = 0;
  int64_t world_size = 1;
  // Training: every rank must run the same number of batches (each one is a
  // collective), so the order is padded by repeating its start (or, with
  // drop_last, cut) to a multiple of world_size. Evaluation: no padding, so
  // every sample is counted exactly once; ranks may run different batch counts.
  bool equal_shards = true;
  // A resumed epoch: the first `first_sample` positions of the epoch's
  // global order (all ranks' batches together, as the saving run padded it)
  // are trained; the plan covers the rest. Training (equal_shards) only.
  // - Saved by a run of these options' world size and batch size: the plan
  //   is exactly the whole epoch's without its first first_sample /
  //   (batch_size * world_size) batches, padding included.
  // - Saved by a run of another shape (`saved_elsewhere`): the rest is
  //   sharded without padding, so each sample of the epoch is trained once.
  //   Each batch index is a round: a contiguous run of the order dealt out
  //   across the ranks, so the position after every batch is exact. The
  //   ranks must still run as many batches each: the last two rounds share
  //   what is left so that every rank has a sample in each (never a batch
  //   larger than batch_size). Only a rest of fewer samples than ranks, or
  //   batch_size 1, pads a rank with a repeated sample. drop_last cuts the
  //   rest to whole batches on every rank, as it cuts an epoch.
  int64_t first_sample = 0;
  bool saved_elsewhere = false;
};

BatchPlan plan_epoch(const SamplerOptions& options, int64_t epoch, int64_t length);

// The shuffled orders of a run's epochs, drawn from one generator kept
// between calls. The order of epoch e is the (e+1)-th randperm(length) of a
// generator seeded `seed`; replaying e earlier draws for every epoch made
// planning epoch e cost e+1 draws (a run of E epochs ~E^2/2, a run resumed
// at a late epoch paid for every earlier one on every epoch). Kept here, the
// next epoch costs one draw: the same draws, from the same generator, in the
// same sequence, hence exactly the same orders. Asking for an epoch already
// drawn, another seed or another length starts again from the seed. Not
// thread-safe: one owner (the run's BatchSource) plans its epochs.
class EpochOrders {
 public:
  EpochOrders();
  ~EpochOrders();
  EpochOrders(const EpochOrders&) = delete;
  EpochOrders& operator=(const EpochOrders&) = delete;

  // randperm(length) number `epoch` (0-based) of a generator seeded `seed`.
  std::vector<int64_t> order(uint64_t seed, int64_t epoch, int64_t length);
  // How many randperm draws this object has made (tests: a sequential run
  // draws once per epoch).
  int64_t draws() const { return draws_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  int64_t draws_ = 0;
};

// plan_epoch, with the shuffled order taken from `orders` (same plans).
BatchPlan plan_epoch(const SamplerOptions& options, int64_t epoch, int64_t length, EpochOrders& orders);

// How many batches this rank's shard of `length` samples makes, before
// max_batches (what plan_epoch would cut with max_batches = -1).
int64_t batches_in_shard(const SamplerOptions& options, int64_t length);

}  // namespace kiln
