// distributed.shard = "parameters" in one process (optim/sharded_parameters.hpp):
// with every parameter's storage freed and a bucket per parameter, a
// forward and backward read through the RecordFunction callback compute
// the whole model's outputs and gradients to the bit, gathering in
// backward what forward freed; a frozen parameter is gathered alike; and a
// write into a whole parameter is reported, not lost at the next free.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "optim/shard_layout.hpp"
#include "optim/sharded_parameters.hpp"

namespace kiln {
namespace {

struct Model {
  torch::nn::Linear first{8, 16}, second{16, 4};
  at::Tensor loss(const at::Tensor& x) {
    at::Tensor y = second->forward(torch::relu(first->forward(x)));
    return (y * y).sum();
  }
};

ShardLayout layout_of(const std::vector<at::Tensor>& params) {
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  return ShardLayout(numels, 1, 0);
}

TEST(ShardedParameters, ReadThroughTheShardsTheModelGivesTheWholeModelsGradientsToTheBit) {
  torch::manual_seed(3);
  Model model;
  model.first->bias.set_requires_grad(false);  // frozen: a layout of its own
  const at::Tensor x = torch::randn({5, 8}, torch::requires_grad());
  model.loss(x).backward();
  const at::Tensor want_x = x.grad().clone();
  const at::Tensor want_w = model.first->weight.grad().clone(), want_v = model.second->weight.grad().clone();
  auto clear_grads = [&] {
    x.mutable_grad().reset();
    model.first->weight.mutable_grad().reset();
    model.second->weight.mutable_grad().reset();
    model.second->bias.mutable_grad().reset();
  };
  clear_grads();

  const std::vector<at::Tensor> trainable{model.first->weight, model.second->weight, model.second->bias};
  const ShardLayout layout = layout_of(trainable);
  ShardedParameters sharded(trainable, layout, {model.first->bias}, nullptr, /*bucket_bytes=*/1);
  sharded.shard();
  for (const auto& p : {model.first->weight, model.first->bias, model.second->weight})
    EXPECT_EQ(p.storage().nbytes(), 0u);
  // A forward and backward read through the shards: the whole model's bits.
  auto pass = [&] {
    {
      ShardedParameters::Active reading(sharded);
      model.loss(x).backward();
      sharded.release_all();
      EXPECT_NO_THROW(sharded.check());
    }
    EXPECT_TRUE(at::equal(x.grad(), want_x));
    EXPECT_TRUE(at::equal(model.first->weight.grad(), want_w));
    EXPECT_TRUE(at::equal(model.second->weight.grad(), want_v));
  };
  pass();
  EXPECT_EQ(model.second->weight.storage().nbytes(), 0u);
  const ShardedParameters::Stats stats = sharded.stats();
  // Forward gathers the 4; backward again the two weights its input's
  // gradient needs (the second layer's, still whole, aside).
  EXPECT_GE(stats.gathers, 5);
  EXPECT_EQ(stats.total_bytes, (8 * 16 + 16 + 16 * 4 + 4) * 4);
  EXPECT_EQ(stats.peak_whole_bytes, (8 * 16 + 16) * 4) << "one layer's weight and bias at most";
  EXPECT_EQ(stats.prefetched, 0) << "the first pass has none before it to follow";

  // The second pass follows the first: every bucket but the first is asked
  // for before an operator reads it, and the gradients are the same bits.
  clear_grads();
  pass();
  const ShardedParameters::Stats again = sharded.stats();
  EXPECT_EQ(again.gathers - stats.gathers, stats.gathers) << "the same buckets as the first pass";
  // All but what the first operator reads (the first layer's weight, and
  // its bias where linear reads both at once).
  EXPECT_GE(again.prefetched, stats.gathers - 2) << again.gathers << " gathers";
  // The second layer's weight on its way while the first layer computes.
  EXPECT_LE(again.peak_whole_bytes, (8 * 16 + 16 + 16 * 4) * 4);
}

TEST(ShardedParameters, AWriteIntoAWholeParameterIsReportedNotLost) {
  torch::manual_seed(3);
  Model model;
  const std::vector<at::Tensor> trainable{model.first->weight, model.first->bias, model.second->weight,
                                          model.second->bias};
  const ShardLayout layout = layout_of(trainable);
  ShardedParameters sharded(trainable, layout, {}, nullptr, /*bucket_bytes=*/1);
  sharded.shard();
  ShardedParameters::Active reading(sharded);
  {
    at::NoGradGuard no_grad;
    model.first->weight.mul_(2);  // a plugin's in-place change, outside the optimizer
  }
  sharded.release_all();
  try {
    sharded.check();
    ADD_FAILURE() << "the write was not reported";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("something wrote into trained parameter 0 while it was gathered whole"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
