// kiln.cnn — a small convolutional classifier for square images. For each
// entry of `channels`: a 3x3 convolution (padding 1) + ReLU + 2x2 max-pool;
// then a hidden Linear + ReLU + dropout, and the output Linear. Sized for
// 1x28x28 images (Fashion-MNIST) by default; input may be flat [N, C*S*S] or
// [N, C, S, S].
//
// [model]
// path = "kiln_cnn"
// in_channels = 1
// image_size = 28         # S: images are S x S
// channels = [32, 64]     # output channels of each conv block
// hidden = 128            # width of the hidden Linear layer
// classes = 10
// dropout = 0.25          # before the output layer, in training only
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"
#include "kiln_plugins/classifier.hpp"

namespace {

constexpr const char* kId = "kiln.cnn";

class Cnn final : public kiln_plugins::Classifier {
 public:
  Cnn(const kiln::Host& host, kiln::Config& config) : Classifier(host) {
    using kiln_plugins::positive;
    in_channels_ = positive("in_channels", config.get<int64_t>("in_channels", 1));
    image_size_ = positive("image_size", config.get<int64_t>("image_size", 28));
    const std::vector<int64_t> channels = config.get_list<int64_t>("channels", {32, 64});
    const int64_t hidden = positive("hidden", config.get<int64_t>("hidden", 128));
    const int64_t classes = positive("classes", config.get<int64_t>("classes", 10));
    dropout_ = kiln_plugins::dropout_rate("dropout", config.get<double>("dropout", 0.25));
    if (channels.empty()) throw kiln::ConfigError("'channels' needs at least one entry");

    int64_t side = image_size_;
    for (size_t i = 0; i < channels.size(); ++i) {
      positive("channels[" + std::to_string(i) + "]", channels[i]);
      side /= 2;
    }
    if (side == 0)
      throw kiln::ConfigError("image_size " + std::to_string(image_size_) + " is too small for " +
                              std::to_string(channels.size()) +
                              " pooling stages; use fewer 'channels' entries");

    // Built in create, where the host has just seeded the generator, so the
    // initial weights are a function of the run's seed.
    int64_t in = in_channels_;
    for (size_t i = 0; i < channels.size(); ++i) {
      convs_.push_back(net_.register_module(
          "conv" + std::to_string(i + 1),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, channels[i], 3).padding(1))));
      in = channels[i];
    }
    fc1_ = net_.register_module("fc1", torch::nn::Linear(in * side * side, hidden));
    fc2_ = net_.register_module("fc2", torch::nn::Linear(hidden, classes));
  }

  torch::nn::Module& module() override { return net_; }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    const int64_t n = input.size(0);
    const int64_t per_sample = in_channels_ * image_size_ * image_size_;
    if (input.numel() != n * per_sample)
      throw std::runtime_error(
          "each input sample has " + std::to_string(n ? input.numel() / n : 0) +
          " values but in_channels x image_size^2 = " + std::to_string(per_sample) +
          "; set in_channels and image_size in the [model] table to match the data");
    // Integer pixels (kiln_arrays serves integer arrays as int64) as floats.
    at::Tensor x = (input.is_floating_point() ? input : input.to(at::kFloat))
                       .reshape({n, in_channels_, image_size_, image_size_});
    for (auto& conv : convs_)
      x = torch::max_pool2d(torch::relu(conv->forward(x)), /*kernel_size=*/2);
    x = torch::relu(fc1_->forward(x.flatten(/*start_dim=*/1)));
    if (dropout_ > 0.0) x = torch::dropout(x, dropout_, net_.is_training());
    return fc2_->forward(x);
  }

 private:
  torch::nn::Module net_{"Cnn"};
  std::vector<torch::nn::Conv2d> convs_;
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
  int64_t in_channels_ = 0;
  int64_t image_size_ = 0;
  double dropout_ = 0.0;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Cnn>(
    {kId, "CNN", "0.1.0", "Small convolutional image classifier (conv-relu-pool blocks)"}))
