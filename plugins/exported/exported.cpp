// kiln.exported — trains a model written in Python, from its torch.export
// programs, with no Python in the run (docs/models.md, "Your model from
// Python"). python/kiln_export.py writes the `.pt2`: the training-mode and
// evaluation-mode programs of the module (Dropout and BatchNorm differ), a
// dynamic batch dimension, and its state_dict's parameters and buffers.
//
// [model]
// path = "kiln_exported"
// program = "model.pt2"        # relative to where kiln runs, as data paths are
// loss = "cross_entropy"        # the program's output are logits [N, classes]; or
//                               # "mse": its output are values, against a float target;
//                               # "output": the program is forward(input, target)
//                               # and returns the loss itself (a scalar)
//
// A language model's program returns logits [N, T, vocabulary] for tokens
// [N, T] (kiln_token_stream's batches): the cross-entropy is then over every
// position, and val/loss and val/acc are per token.
//
// The parameters and buffers become this module's, under their state_dict
// names (fc1.weight, bn.running_mean): optimizer groups, clipping, EMA/SWA,
// checkpoints and `kiln export` see them as any C++ model's, and an exported
// safetensors file loads into the Python module with load_state_dict. The
// training program runs in training, the evaluation program in validation,
// test and predict; buffers a program updates (BatchNorm's running
// statistics, num_batches_tracked) are this module's own tensors, updated
// in place. Dropout draws from LibTorch's default generator, which kiln
// seeds, so seeds and resume keep their guarantees.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "graph_program.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/classifier.hpp"
#include "pt2_archive.hpp"

#ifndef KILN_EXPORTED_TORCH_VERSION
#error "KILN_EXPORTED_TORCH_VERSION: the LibTorch version this plugin is built against"
#endif

namespace {

constexpr const char* kId = "kiln.exported";

// A module tree named as the Python module's: "bn.running_mean" is buffer
// running_mean of submodule bn.
torch::nn::Module& submodule_for(torch::nn::Module& root, const std::string& fqn, std::string* leaf) {
  torch::nn::Module* at = &root;
  size_t begin = 0;
  for (size_t dot = fqn.find('.'); dot != std::string::npos; begin = dot + 1, dot = fqn.find('.', begin)) {
    const std::string part = fqn.substr(begin, dot - begin);
    std::shared_ptr<torch::nn::Module> child;
    for (const auto& item : at->named_children())
      if (item.key() == part) child = item.value();
    if (!child) child = at->register_module(part, std::make_shared<torch::nn::Module>(part));
    at = child.get();
  }
  *leaf = fqn.substr(begin);
  return *at;
}

class Exported final : public kiln_plugins::Classifier {
 public:
  Exported(const kiln::Host& host, kiln::Config& config) : Classifier(host) {
    path_ = config.get<std::string>("program", "");
    if (path_.empty())
      throw kiln::ConfigError("'program' must name the .pt2 that python/kiln_export.py wrote");
    const std::string loss = config.get<std::string>("loss", "cross_entropy");
    if (loss == "cross_entropy")
      loss_ = Loss::cross_entropy;
    else if (loss == "mse")
      loss_ = Loss::mse;
    else if (loss == "output")
      loss_ = Loss::output;
    else
      throw kiln::ConfigError("'loss' must be \"cross_entropy\" (the program returns class logits), \"mse\" (it "
                              "returns values) or \"output\" (it returns the loss), not \"" + loss + "\"");
    std::map<std::string, kiln_exported::Pt2Program> programs;
    try {
      programs = kiln_exported::read_pt2(path_, KILN_EXPORTED_TORCH_VERSION);
      for (const char* needed : {"train", "eval"})
        if (!programs.count(needed))
          throw kiln_exported::Pt2Error("'" + path_ + "' has no '" + needed +
                                        "' program; write it with python/kiln_export.py, which exports both");
      // The training program's copies become the module's tensors; the
      // evaluation program reads the same ones by name.
      std::map<std::string, at::Tensor> state;
      for (auto& [fqn, weight] : programs.at("train").weights) {
        std::string leaf;
        torch::nn::Module& owner = submodule_for(net_, fqn, &leaf);
        state[fqn] = weight.is_param ? owner.register_parameter(leaf, weight.value, /*requires_grad=*/true)
                                     : owner.register_buffer(leaf, weight.value);
      }
      train_ = std::make_unique<kiln_exported::GraphProgram>(*programs.at("train").program, path_, "train", state,
                                                             programs.at("train").constants);
      eval_ = std::make_unique<kiln_exported::GraphProgram>(*programs.at("eval").program, path_, "eval", state,
                                                            programs.at("eval").constants);
    } catch (const kiln_exported::Pt2Error& e) {
      throw kiln::InvalidInput(e.what());
    }
    const size_t inputs = loss_ == Loss::output ? 2 : 1;
    if (train_->input_shapes().size() != inputs)
      throw kiln::InvalidInput(
          "'" + path_ + "': the program takes " + std::to_string(train_->input_shapes().size()) + " inputs; with loss = \"" +
          loss + "\" kiln.exported passes " +
          (inputs == 1 ? "the batch's \"input\" alone (export forward(x))"
                       : "the batch's \"input\" and \"target\" (export forward(x, y), returning the loss)"));
    std::string ops;
    for (const auto& [op, count] : train_->operators()) ops += (ops.empty() ? "" : ", ") + op + " x" + std::to_string(count);
    host.info("model '" + std::string(kId) + "': " + path_ + ", training program of " +
              std::to_string(train_->node_count()) + " nodes: " + ops);
  }

  torch::nn::Module& module() override { return net_; }

  // Before anything runs: the data module's batches against the shapes the
  // programs were exported for (kiln exits 2, both shapes named).
  void check_batch(kiln::Split split, const kiln::Batch& batch) override {
    if (!batch.has("input"))
      throw kiln::InvalidInput("'" + path_ + "' takes the batch's \"input\", and the data module's batches have none");
    std::vector<at::Tensor> inputs{batch["input"]};
    if (loss_ == Loss::output && split != kiln::Split::predict) {
      if (!batch.has("target"))
        throw kiln::InvalidInput("'" + path_ + "': with loss = \"output\" the program takes the batch's \"target\", "
                                 "and the data module's batches have none");
      inputs.push_back(batch["target"]);
    }
    if (loss_ == Loss::output && split == kiln::Split::predict) return;  // refused by predict_step, with why
    (split == kiln::Split::train ? *train_ : *eval_).check_inputs(inputs, /*any_batch_size=*/true);
    // Then the evaluation program on them (a dtype it cannot take).
    if (loss_ != Loss::output) Classifier::check_batch(split, batch);
  }

  // A sequence's logits [N, T, V] against its targets [N, T]: every
  // position is a prediction. Class logits [N, C] are the classifier's.
  at::Tensor training_step(const kiln::Batch& batch, int64_t index) override {
    if (loss_ != Loss::cross_entropy) return regression_loss(batch);
    if (batch["target"].dim() != 2) return Classifier::training_step(batch, index);
    const at::Tensor logits = forward(batch["input"]);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch["target"].reshape({-1}));
  }
  void validation_step(const kiln::Batch& batch, int64_t index) override {
    if (loss_ != Loss::cross_entropy) return log_loss(batch, "val/");
    if (batch["target"].dim() != 2) return Classifier::validation_step(batch, index);
    evaluate_tokens(batch, "val/");
  }
  void test_step(const kiln::Batch& batch, int64_t index) override {
    if (loss_ != Loss::cross_entropy) return log_loss(batch, "test/");
    if (batch["target"].dim() != 2) return Classifier::test_step(batch, index);
    evaluate_tokens(batch, "test/");
  }
  // A language model predicts the next token's probabilities at each
  // prompt's end.
  at::Tensor predict_step(const kiln::Batch& batch, int64_t index) override {
    if (loss_ == Loss::mse) return forward(batch["input"]);
    if (loss_ == Loss::output)
      throw kiln::InvalidInput("'" + path_ + "': with loss = \"output\" the program needs the target, which "
                               "`kiln predict` has not: export the model's outputs with loss = \"mse\" or "
                               "\"cross_entropy\" to predict");
    if (batch["input"].dim() != 2 || batch["input"].is_floating_point()) return Classifier::predict_step(batch, index);
    const at::Tensor logits = forward(batch["input"]);
    return torch::softmax(logits.select(1, logits.size(1) - 1), /*dim=*/1);
  }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    const kiln_exported::GraphProgram& program = net_.is_training() ? *train_ : *eval_;
    std::vector<at::Tensor> out = program.run({input});
    if (out.size() != 1)
      throw kiln::InvalidInput("'" + path_ + "': the program returns " + std::to_string(out.size()) +
                               " outputs; kiln.exported takes one, the logits");
    return out[0];
  }

 private:
  enum class Loss { cross_entropy, mse, output };

  // The loss of one batch, for "mse" and "output".
  at::Tensor regression_loss(const kiln::Batch& batch) {
    const kiln_exported::GraphProgram& program = net_.is_training() ? *train_ : *eval_;
    const at::Tensor target = batch["target"];
    if (loss_ == Loss::output) {
      std::vector<at::Tensor> out = program.run({batch["input"], target});
      if (out.size() != 1 || out[0].numel() != 1)
        throw kiln::InvalidInput("'" + path_ + "': with loss = \"output\" the program must return one scalar, the loss");
      return out[0].reshape({});
    }
    const at::Tensor prediction = forward(batch["input"]);
    if (prediction.numel() != target.numel())
      throw kiln::InvalidInput("'" + path_ + "': the program returns " + std::to_string(prediction.numel()) +
                               " values for a batch whose target has " + std::to_string(target.numel()) +
                               "; loss = \"mse\" compares them one to one");
    return torch::mse_loss(prediction.reshape(target.sizes()), target.to(prediction.scalar_type()));
  }
  void log_loss(const kiln::Batch& batch, const std::string& prefix) {
    const double n = static_cast<double>(batch["target"].size(0));
    if (n == 0) return;
    host().log_metric(prefix + "loss", regression_loss(batch).detach(), n);
  }

  void evaluate_tokens(const kiln::Batch& batch, const std::string& prefix) {
    const at::Tensor logits = forward(batch["input"]);
    const at::Tensor target = batch["target"].reshape({-1});
    const at::Tensor flat = logits.reshape({-1, logits.size(-1)});
    const double tokens = static_cast<double>(target.size(0));
    if (tokens == 0) return;
    host().log_metric(prefix + "loss", torch::nn::functional::cross_entropy(flat, target), tokens);
    host().log_metric(prefix + "acc", flat.argmax(1).eq(target).to(torch::kDouble).mean(), tokens);
  }

  std::string path_;
  Loss loss_ = Loss::cross_entropy;
  torch::nn::Module net_{"Exported"};
  std::unique_ptr<kiln_exported::GraphProgram> train_, eval_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Exported>({kId, "Exported program", "0.1.0",
                                              "A model written in Python, trained from its torch.export programs"}))
