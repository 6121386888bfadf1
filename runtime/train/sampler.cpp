#include "train/sampler.hpp"

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

BatchPlan cut(const SamplerOptions& options, std::vector<int64_t> epoch_order, int64_t length) {
  BatchPlan plan;
  const int64_t world = std::max<int64_t>(options.world_size, 1);
  const int64_t start = std::clamp<int64_t>(options.first_sample, 0, length);
  const bool resumed = options.first_sample > 0;
  const bool unpadded = resumed && options.saved_elsewhere && options.equal_shards && !options.drop_last;
  // The samples this plan covers: the epoch's order from `start` on.
  std::vector<int64_t> order(epoch_order.begin() + start, epoch_order.end());
  const int64_t rest = length - start;
  if (world > 1 && options.equal_shards) {
    // Padding repeats the order's start, as a whole epoch's does.
    int64_t total = options.drop_last ? rest / world * world : (rest + world - 1) / world * world;
    if (unpadded) total = rest == 0 ? 0 : std::max(rest, world);  // every rank needs a sample
    for (int64_t i = rest; i < total; ++i) order.push_back(epoch_order[(i - rest) % length]);
    order.resize(total);
  }
  for (size_t i = static_cast<size_t>(options.rank); i < order.size(); i += static_cast<size_t>(world))
    plan.indices.push_back(order[i]);
  const int64_t shard = static_cast<int64_t>(plan.indices.size());
  std::vector<int64_t> sizes = batch_sizes(shard, options.batch_size, options.drop_last);
  if (unpadded && world > 1 && !order.empty()) {
    // Shards differ by one sample at most; every rank runs as many batches
    // as the longest shard. One batch short: the last batch splits in two.
    const size_t most = batch_sizes((static_cast<int64_t>(order.size()) + world - 1) / world, options.batch_size, false).size();
    if (sizes.size() + 1 == most && !sizes.empty() && sizes.back() > 1) {
      const int64_t last = sizes.back();
      sizes.back() = last - last / 2;
      sizes.push_back(last / 2);
    } else if (sizes.size() + 1 == most) {  // batch size 1: a repeated sample
      plan.indices.push_back(order[0]);
      sizes.push_back(1);
    }
  }
  if (resumed) plan.first_batch = options.first_sample / (options.batch_size * world);
  size_t batches = sizes.size();
  if (options.max_batches >= 0)
    batches = std::min<size_t>(batches, static_cast<size_t>(std::max<int64_t>(options.max_batches - plan.first_batch, 0)));
  plan.offsets.reserve(batches + 1);
  plan.offsets.push_back(0);
  for (size_t b = 0; b < batches; ++b) plan.offsets.push_back(plan.offsets.back() + static_cast<size_t>(sizes[b]));
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
