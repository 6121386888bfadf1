// example.whole_split_metric — a metric over the whole validation split,
// the kiln way. Lightning's pattern is "append in validation_step, all_gather
// and compute in on_validation_epoch_end"; here it is:
//
//   validation_step   host().collect("scores", ...) and ("target", ...):
//                     one row per sample, copied by the host;
//   on_epoch_end      every rank gets the rows of every rank, ordered by
//                     sample index, each sample once: compute AUROC, macro-F1
//                     and a confusion matrix with kiln/metrics.hpp and log
//                     them. No gather, no padding, no list to clear.
//
// The model is a small MLP (or logistic regression) classifier trained with
// cross-entropy; see README.md next to this file.
//
// [model]
// path = "kiln_example_whole_split_metric"
// features = 32        # inputs per sample, after flattening
// hidden = [64]        # hidden layer widths; [] is logistic regression
// classes = 4
// collect = true       # false: loss and accuracy only, no whole-split
//                      # metrics (the baseline of bench/collect_cost.sh)
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <kiln/metrics.hpp>
#include <kiln/plugin.hpp>

namespace {

class WholeSplitMetric final : public kiln::Model {
 public:
  // The constructor is `create`: read the config and build the layers here,
  // so that the host's seed decides the initial weights.
  WholeSplitMetric(const kiln::Host& host, kiln::Config& config) : kiln::Model(host) {
    int64_t width = config.get<int64_t>("features", 32);
    std::vector<int64_t> widths = config.get_list<int64_t>("hidden", {64});
    classes_ = config.get<int64_t>("classes", 4);
    collect_ = config.get<bool>("collect", true);
    widths.push_back(classes_);
    for (const int64_t w : widths)
      if (w <= 0 || width <= 0)
        throw kiln::ConfigError("example.whole_split_metric: 'features', 'hidden' and 'classes' must be positive");
    for (size_t i = 0; i < widths.size(); ++i) {
      layers_.push_back(net_.register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, widths[i])));
      width = widths[i];
    }
  }

  torch::nn::Module& module() override { return net_; }

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(logits(batch), batch["target"]);
  }

  // Lightning: self.scores.append(...); self.targets.append(...)
  void validation_step(const kiln::Batch& batch, int64_t) override {
    const at::Tensor out = logits(batch);
    const at::Tensor target = batch["target"];
    // Means over samples still go through log_metric: the host adds them up
    // over batches and ranks, weighted by the batch's size.
    const double n = static_cast<double>(target.size(0));
    host().log_metric("val/loss", torch::nn::functional::cross_entropy(out, target), n);
    host().log_metric("val/acc", out.argmax(1).eq(target).to(torch::kDouble).mean(), n);
    if (!collect_) return;
    // One row per sample of this batch; the host copies them (detached), so
    // nothing here needs to be kept. Every step collects the same names,
    // with the same dtype and trailing shape.
    host().collect("scores", torch::softmax(out, /*dim=*/1));  // float32 [n, classes]
    host().collect("target", target);                          // int64 [n]
  }

  // Lightning: on_validation_epoch_end, after self.all_gather(...).
  // Called on every rank at the end of every epoch (train, val, test); for a
  // split that collected nothing `rows` is empty.
  void on_epoch_end(kiln::Split split, const kiln::Collected& rows) override {
    if (split != kiln::Split::val || rows.empty()) return;
    // The whole split, in sample order: the same bytes on every rank and
    // with any number of processes, so every rank computes the same value.
    const at::Tensor scores = rows["scores"], target = rows["target"];
    // Logged here, a value is taken as it is (not averaged over batches or
    // ranks): the metric of the whole split.
    host().log_metric("val/auroc", kiln::metrics::auroc(scores, target));
    host().log_metric("val/f1_macro", kiln::metrics::f1(scores, target, classes_, kiln::metrics::Average::macro));

    // Every rank holds the same matrix; one of them prints it.
    if (host().rank() != 0) return;
    const at::Tensor matrix = kiln::metrics::confusion_matrix(scores, target, classes_).contiguous();
    std::ostringstream text;
    text << "val confusion matrix over " << rows.size() << " samples (row: true class, column: predicted):";
    for (int64_t i = 0; i < classes_; ++i) {
      text << "\n ";
      for (int64_t j = 0; j < classes_; ++j) text << " " << matrix[i][j].item<int64_t>();
    }
    host().info(text.str());
  }

 private:
  at::Tensor logits(const kiln::Batch& batch) {
    const at::Tensor input = batch["input"];
    at::Tensor x = input.reshape({input.size(0), -1});
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->forward(x);
      if (i + 1 < layers_.size()) x = torch::relu(x);
    }
    return x;
  }

  torch::nn::Module net_{"WholeSplitMetric"};
  std::vector<torch::nn::Linear> layers_;
  int64_t classes_ = 0;
  bool collect_ = true;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<WholeSplitMetric>(
    {"example.whole_split_metric", "Whole-split metrics (example)", "1.0.0",
     "An MLP that collects scores and targets in validation_step and logs AUROC, macro-F1 and a confusion matrix "
     "over the whole split in on_epoch_end"}))
