// kiln.mlp — a multi-layer perceptron classifier: Linear layers fc1..fcN with
// ReLU (and optional dropout) between them, on inputs flattened to [N, -1].
//
// [model]
// path = "kiln_mlp"
// in_features = 784       # features per sample after flattening
// hidden = [256, 128]     # widths of the hidden layers; [] is logistic regression
// classes = 10
// dropout = 0.0           # after each hidden ReLU, in training only
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"
#include "kiln_plugins/classifier.hpp"

namespace {

constexpr const char* kId = "kiln.mlp";

class Mlp final : public kiln_plugins::Classifier {
 public:
  Mlp(const kiln::Host& host, kiln::Config& config) : Classifier(host) {
    using kiln_plugins::positive;
    in_features_ = positive("in_features", config.get<int64_t>("in_features", 784));
    std::vector<int64_t> widths = config.get_list<int64_t>("hidden", {256, 128});
    for (size_t i = 0; i < widths.size(); ++i)
      positive("hidden[" + std::to_string(i) + "]", widths[i]);
    widths.push_back(positive("classes", config.get<int64_t>("classes", 10)));
    dropout_ = kiln_plugins::dropout_rate("dropout", config.get<double>("dropout", 0.0));

    // Built here rather than in setup: the host seeds the generator right
    // before create, and building fc1, fc2, ... in order with LibTorch's
    // default init makes the weights identical to the same stack of
    // torch::nn::Linear built by hand after torch::manual_seed.
    int64_t width = in_features_;
    for (size_t i = 0; i < widths.size(); ++i) {
      layers_.push_back(
          net_.register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, widths[i])));
      width = widths[i];
    }
  }

  torch::nn::Module& module() override { return net_; }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    // Already flat (the usual [N, features] batch): used as is; a reshape
    // would still build a view per step.
    // Integer features (kiln_arrays serves integer arrays as int64) as floats.
    at::Tensor x = input.is_floating_point() ? input : input.to(at::kFloat);
    if (x.dim() != 2) x = x.reshape({x.size(0), -1});
    if (x.size(1) != in_features_)
      throw std::runtime_error(
          "input has " + std::to_string(x.size(1)) +
          " features per sample but in_features = " + std::to_string(in_features_) +
          "; set in_features in the [model] table to match the data");
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->forward(x);
      if (i + 1 == layers_.size()) break;
      // In place: the Linear's output is not needed by its backward (addmm
      // keeps its inputs), and the step saves a tensor a layer.
      x.relu_();
      // Skipped outright at 0 so the arithmetic is exactly Linear/ReLU.
      if (dropout_ > 0.0) x = torch::dropout(x, dropout_, net_.is_training());
    }
    return x;
  }

 private:
  torch::nn::Module net_{"Mlp"};
  std::vector<torch::nn::Linear> layers_;
  int64_t in_features_ = 0;
  double dropout_ = 0.0;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Mlp>({kId, "MLP", "0.1.0",
                                         "Multi-layer perceptron classifier (Linear + ReLU)"}))
