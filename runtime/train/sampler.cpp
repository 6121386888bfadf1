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

BatchPlan cut(const SamplerOptions& options, std::vector<int64_t> epoch_order, int64_t length) {
  BatchPlan plan;
  plan.indices = std::move(epoch_order);
  if (options.world_size > 1) {
    const int64_t world = options.world_size;
    std::vector<int64_t> order = std::move(plan.indices);
    if (options.equal_shards) {
      const int64_t per_rank = options.drop_last ? length / world : (length + world - 1) / world;
      const int64_t total = per_rank * world;
      for (int64_t i = length; i < total; ++i) order.push_back(order[(i - length) % length]);
      order.resize(total);
    }
    plan.indices.clear();
    for (size_t i = static_cast<size_t>(options.rank); i < order.size(); i += static_cast<size_t>(world))
      plan.indices.push_back(order[i]);
    length = static_cast<int64_t>(plan.indices.size());
    if (length == 0) {
      plan.offsets.push_back(0);
      return plan;
    }
  }
  int64_t batches = options.drop_last ? length / options.batch_size
                                      : (length + options.batch_size - 1) / options.batch_size;
  if (options.max_batches >= 0 && options.max_batches < batches) batches = options.max_batches;
  plan.offsets.reserve(batches + 1);
  for (int64_t b = 0; b < batches; ++b) plan.offsets.push_back(b * options.batch_size);
  plan.offsets.push_back(std::min<int64_t>(batches * options.batch_size, length));
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
