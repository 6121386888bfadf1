#include "data/sampler.hpp"

#include <numeric>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace kiln {

namespace {

at::Tensor draw(at::Generator& generator, int64_t length) {
  return at::randperm(length, generator, at::TensorOptions().dtype(at::kLong));
}

// What plan_epoch does with an epoch's order (sharding, batches, limits).
BatchPlan cut(const SamplerOptions& options, std::vector<int64_t> epoch_order, int64_t length);

}  // namespace

struct EpochOrders::State {
  uint64_t seed = 0;
  int64_t length = -1;
  int64_t next_epoch = 0;  // the epoch the generator's next draw is the order of
  at::Generator generator;
};

EpochOrders::EpochOrders() = default;
EpochOrders::~EpochOrders() = default;

std::vector<int64_t> EpochOrders::order(uint64_t seed, int64_t epoch, int64_t length) {
  if (epoch < 0) throw std::invalid_argument("epoch must be non-negative");
  State* s = state_.get();
  if (s == nullptr || s->seed != seed || s->length != length || epoch < s->next_epoch) {
    state_ = std::make_unique<State>();
    s = state_.get();
    s->seed = seed;
    s->length = length;
    s->generator = at::detail::createCPUGenerator(seed);
  }
  // Earlier epochs' draws only advance the generator: their orders are not needed.
  for (; s->next_epoch < epoch; ++s->next_epoch, ++draws_) draw(s->generator, length);
  const at::Tensor permutation = draw(s->generator, length);
  ++s->next_epoch;
  ++draws_;
  const int64_t* data = permutation.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + length);
}

BatchPlan plan_epoch(const SamplerOptions& options, int64_t epoch, int64_t length, EpochOrders& orders) {
  if (options.batch_size < 1) throw std::invalid_argument("batch size must be at least 1");
  if (length <= 0 || !options.shuffle) return plan_epoch(options, epoch, length);
  return cut(options, orders.order(options.seed, epoch, length), length);
}

BatchPlan plan_epoch(const SamplerOptions& options, int64_t epoch, int64_t length) {
  if (options.batch_size < 1) throw std::invalid_argument("batch size must be at least 1");
  if (length <= 0) {
    BatchPlan plan;
    plan.offsets.push_back(0);
    return plan;
  }
  std::vector<int64_t> order;
  if (options.shuffle) {
    at::Generator generator = at::detail::createCPUGenerator(options.seed);
    at::Tensor permutation;
    // The reference: replays every earlier epoch's draw (EpochOrders keeps
    // the generator instead, for the run's own planning).
    for (int64_t e = 0; e <= epoch; ++e) permutation = draw(generator, length);
    const int64_t* data = permutation.data_ptr<int64_t>();
    order.assign(data, data + length);
  } else {
    order.resize(length);
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  return cut(options, std::move(order), length);
}

namespace {

// The batch sizes of a shard of `shard` samples.
std::vector<int64_t> batch_sizes(int64_t shard, int64_t batch_size, bool drop_last) {
  const int64_t full = shard / batch_size, rest = shard % batch_size;
  std::vector<int64_t> sizes(static_cast<size_t>(full), batch_size);
  if (rest > 0 && !drop_last) sizes.push_back(rest);
  return sizes;
}

// The rest of an epoch saved by a run of another shape, as rounds: round j
// is a contiguous run of the order, dealt out across the ranks (rank r takes
// its r-th, (r+world)-th, ... sample), so every round ends at a position of
// the order — what a checkpoint after it records. Rounds are batch_size x
// world samples, but the last two share what is left so that every rank has
// a sample in each (a round smaller than the world is padded only when the
// rest itself is, or batch_size is 1).
std::vector<int64_t> rounds_of(int64_t rest, int64_t world, int64_t batch_size) {
  const int64_t full = batch_size * world;
  std::vector<int64_t> rounds(static_cast<size_t>(rest / full), full);
  const int64_t tail = rest % full;
  if (tail == 0) return rounds;
  if (tail >= world || rounds.empty() || batch_size == 1) {
    rounds.push_back(std::max(tail, world));  // padded only below the world
    return rounds;
  }
  rounds.back() = full + tail - world;
  rounds.push_back(world);
  return rounds;
}

BatchPlan cut_unpadded(const SamplerOptions& options, const std::vector<int64_t>& epoch_order, int64_t length) {
  BatchPlan plan;
  const int64_t world = std::max<int64_t>(options.world_size, 1);
  const int64_t start = std::min<int64_t>(options.first_sample, length);
  plan.first_batch = options.first_sample / (options.batch_size * world);
  plan.offsets.push_back(0);
  int64_t at = start;  // where the round starts in the epoch's order
  const std::vector<int64_t> rounds = rounds_of(length - start, world, options.batch_size);
  const size_t limit = options.max_batches < 0 ? rounds.size()
                                               : static_cast<size_t>(std::max<int64_t>(options.max_batches - plan.first_batch, 0));
  for (size_t j = 0; j < rounds.size() && j < limit; ++j) {
    for (int64_t i = options.rank; i < rounds[j]; i += world)
      plan.indices.push_back(epoch_order[(at + i < length ? at + i : at + i - length) % length]);
    plan.offsets.push_back(plan.indices.size());
    at += rounds[j];
    plan.positions.push_back(std::min<int64_t>(at, length));
  }
  return plan;
}

BatchPlan cut(const SamplerOptions& options, std::vector<int64_t> epoch_order, int64_t length) {
  const bool resumed = options.first_sample > 0;
  if (resumed && options.saved_elsewhere && options.equal_shards && !options.drop_last)
    return cut_unpadded(options, epoch_order, length);
  BatchPlan plan;
  const int64_t world = std::max<int64_t>(options.world_size, 1);
  const int64_t start = std::clamp<int64_t>(options.first_sample, 0, length);
  if (world == 1 && start == 0) {
    // A whole epoch on one rank is the order itself: no copy, every epoch.
    plan.indices = std::move(epoch_order);
  } else {
    // The samples this plan covers: the epoch's order from `start` on.
    std::vector<int64_t> order(epoch_order.begin() + start, epoch_order.end());
    const int64_t rest = length - start;
    if (world > 1 && options.equal_shards) {
      // Padding repeats the order's start, as a whole epoch's does.
      const int64_t total = options.drop_last ? rest / world * world : (rest + world - 1) / world * world;
      for (int64_t i = rest; i < total; ++i) order.push_back(epoch_order[(i - rest) % length]);
      order.resize(total);
    }
    plan.indices.reserve(order.size() / static_cast<size_t>(world) + 1);
    for (size_t i = static_cast<size_t>(options.rank); i < order.size(); i += static_cast<size_t>(world))
      plan.indices.push_back(order[i]);
  }
  const std::vector<int64_t> sizes =
      batch_sizes(static_cast<int64_t>(plan.indices.size()), options.batch_size, options.drop_last);
  if (resumed) plan.first_batch = options.first_sample / (options.batch_size * world);
  size_t batches = sizes.size();
  if (options.max_batches >= 0)
    batches = std::min<size_t>(batches, static_cast<size_t>(std::max<int64_t>(options.max_batches - plan.first_batch, 0)));
  plan.offsets.reserve(batches + 1);
  plan.positions.reserve(batches);
  plan.offsets.push_back(0);
  for (size_t b = 0; b < batches; ++b) {
    plan.offsets.push_back(plan.offsets.back() + static_cast<size_t>(sizes[b]));
    plan.positions.push_back(options.first_sample + static_cast<int64_t>(b + 1) * options.batch_size * world);
  }
  plan.indices.resize(plan.offsets.back());
  return plan;
}

}  // namespace
}  // namespace kiln

namespace kiln {

int64_t batches_in_shard(const SamplerOptions& o, int64_t length) {
  if (length <= 0) return 0;
  const int64_t w = std::max<int64_t>(o.world_size, 1);
  const int64_t shard = w == 1 ? length
                        : o.equal_shards ? (o.drop_last ? length / w : (length + w - 1) / w)
                                         : (length - o.rank + w - 1) / w;
  return o.drop_last ? shard / o.batch_size : (shard + o.batch_size - 1) / o.batch_size;
}

}  // namespace kiln
