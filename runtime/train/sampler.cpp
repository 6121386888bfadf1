#include "train/sampler.hpp"

#include <numeric>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace kiln {

BatchPlan plan_epoch(const SamplerOptions& options, int64_t epoch, int64_t length) {
  if (options.batch_size < 1) throw std::invalid_argument("batch size must be at least 1");
  BatchPlan plan;
  if (length <= 0) {
    plan.offsets.push_back(0);
    return plan;
  }
  if (options.shuffle) {
    at::Generator generator = at::detail::createCPUGenerator(options.seed);
    at::Tensor permutation;
    // Replaying earlier epochs' draws costs ~1 ms each and keeps the order a
    // function of (seed, epoch) without storing generator state.
    for (int64_t e = 0; e <= epoch; ++e)
      permutation = at::randperm(length, generator, at::TensorOptions().dtype(at::kLong));
    const int64_t* data = permutation.data_ptr<int64_t>();
    plan.indices.assign(data, data + length);
  } else {
    plan.indices.resize(length);
    std::iota(plan.indices.begin(), plan.indices.end(), int64_t{0});
  }
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
