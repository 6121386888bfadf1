// kiln_plugins/classifier.hpp — what kiln's shipped classifiers share: the
// batch convention ("input" float32, "target" int64 class labels), the loss,
// the metrics they report and the form of their predictions. A subclass only
// builds its layers and maps an input batch to logits.
//
// Metrics: loss and accuracy are means over samples (log_metric in each
// step); macro-F1 and AUROC (one-vs-rest) are not decomposable, so the
// steps collect each sample's probabilities and label (kiln_host.collect)
// and on_epoch_end computes them over the whole split, identically on every
// rank (docs/metrics.md).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "kiln/metrics.hpp"
#include "kiln/plugin.hpp"

namespace kiln_plugins {

class Classifier : public kiln::Model {
 public:
  using kiln::Model::Model;

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(forward(batch["input"]), labels(batch["target"]));
  }

  void validation_step(const kiln::Batch& batch, int64_t) override {
    evaluate_logits(forward(batch["input"]), batch["target"], "val/");
  }
  void test_step(const kiln::Batch& batch, int64_t) override {
    evaluate_logits(forward(batch["input"]), batch["target"], "test/");
  }

  void on_epoch_end(kiln::Split split, const kiln::Collected& rows) override {
    if (split == kiln::Split::train || rows.empty()) return;
    const std::string prefix = split == kiln::Split::val ? "val/" : "test/";
    const at::Tensor scores = rows["scores"], target = rows["target"];
    host().log_metric(prefix + "f1_macro",
                      kiln::metrics::f1(scores, target, scores.size(1), kiln::metrics::Average::macro));
    host().log_metric(prefix + "auroc", kiln::metrics::auroc(scores, target));
  }

  // Before anything runs (ABI 1.5): the data module's first samples through
  // forward, in evaluation mode and without gradients, so that layers that
  // do not fit the data (in_features, channels, an image size, an exported
  // program's shape) are refused with exit 2 before anything is written,
  // not at the first step.
#ifndef KILN_PLUGINS_WITHOUT_CHECK_BATCH  // tests' twins: the same models, never handed the probe
  void check_batch(kiln::Split split, const kiln::Batch& batch) override {
    if (!batch.has("input"))
      throw kiln::InvalidInput("the data module's batches have no \"input\", which this model takes");
    if (split != kiln::Split::predict && !batch.has("target"))
      throw kiln::InvalidInput(std::string("the data module's ") +
                               (split == kiln::Split::train ? "train" : split == kiln::Split::val ? "val" : "test") +
                               " batches have no \"target\", which this model trains and evaluates against");
    at::Tensor input = batch["input"];
    torch::nn::Module& net = module();
    const std::vector<at::Tensor> params = net.parameters();
    if (!params.empty() && input.device() != params[0].device()) input = input.to(params[0].device());
    const bool training = net.is_training();
    net.eval();
    std::string refused;
    try {
      forward(input);
    } catch (const c10::Error& e) {
      refused = e.what_without_backtrace();
    } catch (const std::exception& e) {
      refused = e.what();
    }
    net.train(training);
    if (refused.empty()) return;
    refused = refused.substr(0, refused.find('\n'));
    std::string shape;
    for (int64_t d : input.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    throw kiln::InvalidInput("the model does not fit the data module's batches (input [" + shape + "] " +
                             std::string(c10::toString(input.scalar_type())) + "): " + refused);
  }
#endif

  // Probabilities rather than logits, so predictions read the same whatever
  // the model and can be compared across runs.
  at::Tensor predict_step(const kiln::Batch& batch, int64_t) override {
    return torch::softmax(forward(batch["input"]), /*dim=*/1);
  }

 protected:
  // Logits [N, classes] of one input batch.
  virtual at::Tensor forward(const at::Tensor& input) = 0;

 protected:
  // Lets a data module hand over int32 labels too; int64 ones are taken as
  // they are, without dispatching the no-op to() every step.
  static at::Tensor labels(const at::Tensor& target) {
    return target.scalar_type() == torch::kLong ? target : target.to(torch::kLong);
  }

  // Weighted by batch size so that the host's epoch mean is the mean over
  // samples, not over batches (the last batch may be short).
  void evaluate_logits(const at::Tensor& logits, const at::Tensor& labels_in, const std::string& prefix) {
    const at::Tensor target = labels(labels_in);
    const int64_t n = target.size(0);
    if (n == 0) return;
    // Tensors, not values: the host reads them back at log points only
    // (ABI 1.1), so an evaluation step on a GPU never waits for the device.
    const at::Tensor loss = torch::nn::functional::cross_entropy(logits, target);
    const at::Tensor accuracy = logits.argmax(/*dim=*/1).eq(target).to(torch::kDouble).mean();
    host().log_metric(prefix + "loss", loss, static_cast<double>(n));
    host().log_metric(prefix + "acc", accuracy, static_cast<double>(n));
    // Copied by the host without waiting for the device; float32
    // probabilities: 4 bytes a class a sample.
    host().collect("scores", torch::softmax(logits, /*dim=*/1));
    host().collect("target", target);
  }
};

}  // namespace kiln_plugins
