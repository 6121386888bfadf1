// kiln_plugins/classifier.hpp — what kiln's shipped classifiers share: the
// batch convention ("input" float32, "target" int64 class labels), the loss,
// the metrics they report and the form of their predictions. A subclass only
// builds its layers and maps an input batch to logits.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "kiln/plugin.hpp"

namespace kiln_plugins {

class Classifier : public kiln::Model {
 public:
  using kiln::Model::Model;

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(forward(batch["input"]), labels(batch));
  }

  void validation_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, "val/"); }
  void test_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, "test/"); }

  // Probabilities rather than logits, so predictions read the same whatever
  // the model and can be compared across runs.
  at::Tensor predict_step(const kiln::Batch& batch, int64_t) override {
    return torch::softmax(forward(batch["input"]), /*dim=*/1);
  }

 protected:
  // Logits [N, classes] of one input batch.
  virtual at::Tensor forward(const at::Tensor& input) = 0;

 private:
  // A no-op for int64; it lets a data module hand over int32 labels too.
  static at::Tensor labels(const kiln::Batch& batch) { return batch["target"].to(torch::kLong); }

  // Weighted by batch size so that the host's epoch mean is the mean over
  // samples, not over batches (the last batch may be short).
  void evaluate(const kiln::Batch& batch, const std::string& prefix) {
    const at::Tensor logits = forward(batch["input"]);
    const at::Tensor target = labels(batch);
    const int64_t n = target.size(0);
    if (n == 0) return;
    // Tensors, not values: the host reads them back at log points only
    // (ABI 1.1), so an evaluation step on a GPU never waits for the device.
    const at::Tensor loss = torch::nn::functional::cross_entropy(logits, target);
    const at::Tensor accuracy = logits.argmax(/*dim=*/1).eq(target).to(torch::kDouble).mean();
    host().log_metric(prefix + "loss", loss, static_cast<double>(n));
    host().log_metric(prefix + "acc", accuracy, static_cast<double>(n));
  }
};

}  // namespace kiln_plugins
