// example.logreg — multinomial logistic regression: one Linear layer from
// `features` inputs to `classes` logits, trained with cross-entropy. A whole
// kiln model plugin in one file, built against an installed kiln.
//
// [model]
// path = "/path/to/libmy_logreg.so"
// features = 32
// classes = 4
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include <kiln/plugin.hpp>

namespace {

class LogisticRegression final : public kiln::Model {
 public:
  // The constructor is `create`: read the config here and build the layers,
  // so that the host's seed decides the initial weights.
  LogisticRegression(const kiln::Host& host, kiln::Config& config) : kiln::Model(host) {
    const auto features = config.get<int64_t>("features", 32);
    const auto classes = config.get<int64_t>("classes", 4);
    if (features <= 0 || classes <= 0)
      throw kiln::ConfigError("example.logreg: 'features' and 'classes' must be positive");
    linear_ = net_.register_module("linear", torch::nn::Linear(features, classes));
  }

  torch::nn::Module& module() override { return net_; }

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(logits(batch), batch["target"]);
  }

  void validation_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, "val"); }
  void test_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, "test"); }

  at::Tensor predict_step(const kiln::Batch& batch, int64_t) override {
    return torch::softmax(logits(batch), /*dim=*/1);
  }

 private:
  at::Tensor logits(const kiln::Batch& batch) {
    const at::Tensor input = batch["input"];
    return linear_->forward(input.reshape({input.size(0), -1}));
  }

  // Plugins only record values; the host averages them over the epoch (and
  // over ranks), weighting each batch by its size.
  void evaluate(const kiln::Batch& batch, const std::string& split) {
    const at::Tensor scores = logits(batch);
    const at::Tensor target = batch["target"];
    const double n = static_cast<double>(target.size(0));
    const double loss = torch::nn::functional::cross_entropy(scores, target).item<double>();
    const double correct = scores.argmax(/*dim=*/1).eq(target).sum().item<double>();
    host().log_metric(split + "/loss", loss, n);
    host().log_metric(split + "/acc", correct / n, n);
  }

  torch::nn::Module net_{"LogisticRegression"};
  torch::nn::Linear linear_{nullptr};
};

}  // namespace

KILN_EXPORT_PLUGINS(
    kiln::describe<LogisticRegression>({"example.logreg", "Logistic regression (example)", "1.0.0",
                                        "One Linear layer and cross-entropy, built out of tree"}))
