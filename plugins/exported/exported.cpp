// kiln.exported — trains a model written in Python, from its torch.export
// programs, with no Python in the run (docs/models.md, "Your model from
// Python"). python/kiln_export.py writes the `.pt2`: the training-mode and
// evaluation-mode programs of the module (Dropout and BatchNorm differ), a
// dynamic batch dimension, its state_dict's parameters and buffers, and
// (extra/kiln.json) the batch's name for each program input and a name for
// each output.
//
// [model]
// path = "kiln_exported"
// program = "model.pt2"        # relative to where kiln runs, as data paths are
// loss = "cross_entropy"        # the chosen output are logits [N, classes] (or [N, T, vocabulary]);
//                               # "mse": values, against a float target;
//                               # "output": the program returns the loss itself (a scalar).
//                               # Default: "output" when the program returns a "loss"
//                               # (a Hugging Face model given labels), else "cross_entropy"
// output = "logits"             # which named output the manifest's loss reads (default:
//                               # "logits" when there is one, else the program's one output)
// target = "target"             # the batch's tensor the manifest's loss compares against
// inputs = { attention_mask = "mask" }   # a program input read from a batch tensor of
//                                         # another name (default: the same name)
// activation_checkpointing = ["model.layers.*"]  # recompute these modules in backward
//
// The parameters and buffers become this module's, under their state_dict
// names (fc1.weight, bn.running_mean): optimizer groups, clipping, EMA/SWA,
// checkpoints and `kiln export` see them as any C++ model's, and an exported
// safetensors file loads into the Python module with load_state_dict. A
// parameter exported with requires_grad false stays frozen. Non-persistent
// buffers and the program's constants are the module's tensors too, but not
// its state: never trained, checkpointed or exported, as PyTorch's
// state_dict() leaves them out. The training program runs in training, the
// evaluation program in validation and test, and `predict` (written when
// the example batch had labels) or else the evaluation program in predict;
// buffers a program updates (BatchNorm's running statistics) are updated in
// place. Dropout draws from LibTorch's default generator, which kiln seeds,
// so seeds and resume keep their guarantees.
#include <fnmatch.h>

#include <map>
#include <optional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "graph_program.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/classifier.hpp"
#include "mapped_weights.hpp"
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

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

int index_of(const std::vector<std::string>& names, const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

// One program with what binds it to batches: the batch tensor each input
// reads and the name of each output.
struct Bound {
  std::string name;  // "train", "eval", "predict"
  std::unique_ptr<kiln_exported::GraphProgram> program;
  std::vector<std::string> inputs;   // the program's names for its inputs
  std::vector<std::string> batch;    // the batch's tensor each reads
  std::vector<std::string> outputs;  // "loss", "logits", "output", ...
};

class Exported final : public kiln_plugins::Classifier {
 public:
  Exported(const kiln::Host& host, kiln::Config& config) : Classifier(host) {
    path_ = config.get<std::string>("program", "");
    if (path_.empty())
      throw kiln::ConfigError("'program' must name the .pt2 that python/kiln_export.py wrote");
    const bool loss_given = config.has("loss");
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
    const bool output_given = config.has("output");
    const std::string output = config.get<std::string>("output", "logits");
    target_ = config.get<std::string>("target", "target");
    const std::map<std::string, std::string> renamed = config.get_string_table("inputs");
    const std::vector<std::string> recompute = config.get_list<std::string>("activation_checkpointing", {});
    std::map<std::string, kiln_exported::Pt2Program> programs;
    try {
      programs = kiln_exported::read_pt2(path_, KILN_EXPORTED_TORCH_VERSION);
      for (const char* needed : {"train", "eval"})
        if (!programs.count(needed))
          throw kiln_exported::Pt2Error("'" + path_ + "' has no '" + needed +
                                        "' program; write it with python/kiln_export.py, which exports both");
      // The training program's copies become the module's tensors; the
      // others read the same ones by name. Its constants hold the
      // non-persistent buffers, which every program shares.
      std::map<std::string, at::Tensor> state;
      for (auto& [fqn, weight] : programs.at("train").weights) {
        std::string leaf;
        torch::nn::Module& owner = submodule_for(net_, fqn, &leaf);
        state[fqn] = weight.is_param ? owner.register_parameter(leaf, weight.value, weight.requires_grad)
                                     : owner.register_buffer(leaf, weight.value);
      }
      const std::map<std::string, at::Tensor>& unplaced = programs.at("train").constants;
      const kiln_exported::Recompute plan{recompute};
      for (const char* name : {"train", "eval", "predict"}) {
        if (!programs.count(name)) continue;
        const kiln_exported::Pt2Program& p = programs.at(name);
        Bound b;
        b.name = name;
        b.program = std::make_unique<kiln_exported::GraphProgram>(
            *p.program, path_, name, state, p.constants, unplaced,
            std::string(name) == "train" ? plan : kiln_exported::Recompute{});
        b.inputs = b.program->input_names();
        const size_t n_in = b.inputs.size(), n_out = b.program->output_count();
        if (!p.input_names.empty() && p.input_names.size() != n_in)
          throw kiln_exported::Pt2Error("'" + path_ + "': extra/kiln.json names " + std::to_string(p.input_names.size()) +
                                        " inputs of program '" + name + "', which takes " + std::to_string(n_in));
        if (!p.output_names.empty() && p.output_names.size() != n_out)
          throw kiln_exported::Pt2Error("'" + path_ + "': extra/kiln.json names " +
                                        std::to_string(p.output_names.size()) + " outputs of program '" + name +
                                        "', which returns " + std::to_string(n_out));
        for (size_t i = 0; i < n_in; ++i) {
          // An archive without the record (an older kiln_export): the
          // batch's "input", and "target" for a forward(x, y).
          if (!p.input_names.empty()) b.inputs[i] = p.input_names[i];
          const std::string own = p.input_names.empty() ? (i == 0 ? "input" : i == 1 ? "target" : b.inputs[i])
                                                         : p.input_names[i];
          const auto it = renamed.find(b.inputs[i]);
          b.batch.push_back(it != renamed.end() ? it->second : own);
        }
        b.outputs = p.output_names;
        if (b.outputs.empty())
          for (size_t i = 0; i < n_out; ++i) b.outputs.push_back(n_out == 1 ? "output" : std::to_string(i));
        bound_[name] = std::move(b);
      }
      for (const auto& [key, batch_name] : renamed)
        if (index_of(bound_.at("train").inputs, key) < 0)
          throw kiln::ConfigError("'inputs' renames '" + key + "', which is not an input of '" + path_ +
                                  "' (its inputs: " + name_list(bound_.at("train").inputs) + ")");
      had_checkpointing_ = programs.at("train").had_checkpointing;
      for (const auto& [fqn, weight] : programs.at("train").weights)
        if (at::isFloatingType(weight.value.scalar_type())) {
          exported_dtype_ = weight.value.scalar_type();
          break;
        }
    } catch (const kiln_exported::Pt2Error& e) {
      throw kiln::InvalidInput(e.what());
    }
    const Bound& train = bound_.at("train");
    // The loss: the program's "loss" output when it returns one, unless the
    // manifest asks for its own.
    const int loss_output = index_of(train.outputs, "loss");
    if (!loss_given && loss_output >= 0) loss_ = Loss::output;
    if (loss_ == Loss::output) {
      if (loss_output >= 0) {
        loss_output_ = "loss";
      } else if (train.outputs.size() == 1) {
        loss_output_ = train.outputs[0];
      } else {
        throw kiln::InvalidInput("'" + path_ + "': with loss = \"output\" the program must return a \"loss\"; it returns " +
                                 name_list(train.outputs));
      }
    }
    // What predictions and the manifest's loss read.
    if (output_given || index_of(train.outputs, output) >= 0) {
      if (index_of(train.outputs, output) < 0)
        throw kiln::ConfigError("'output' = \"" + output + "\" is not an output of '" + path_ + "' (its outputs: " +
                                name_list(train.outputs) + ")");
      output_ = output;
    } else if (train.outputs.size() == 1 && train.outputs[0] != loss_output_) {
      output_ = train.outputs[0];
    } else if (loss_ != Loss::output) {
      throw kiln::InvalidInput("'" + path_ + "' returns " + name_list(train.outputs) +
                               "; name the one the manifest's loss reads with [model] output = \"...\"");
    }
    std::string ops;
    for (const auto& [op, count] : train.program->operators())
      ops += (ops.empty() ? "" : ", ") + op + " x" + std::to_string(count);
    host.info("model '" + std::string(kId) + "': " + path_ + ", training program of " +
              std::to_string(train.program->node_count()) + " nodes: " + ops);
    // A pattern that matches nothing would keep every activation without a word.
    for (const std::string& pattern : recompute) {
      bool matched = false;
      for (const std::string& fqn : train.program->module_names())
        matched = matched || ::fnmatch(pattern.c_str(), fqn.c_str(), 0) == 0;
      if (!matched) {
        std::string some;
        size_t shown = 0;
        for (const std::string& fqn : train.program->module_names())
          if (shown++ < 12) some += (some.empty() ? "" : ", ") + fqn;
        throw kiln::ConfigError("'activation_checkpointing': \"" + pattern + "\" matches no module of '" + path_ +
                                "' (its modules: " + (some.empty() ? "none recorded" : some) +
                                (train.program->module_names().size() > 12 ? ", ..." : "") + ")");
      }
    }
    if (!recompute.empty())
      host.info("model '" + std::string(kId) + "': activation checkpointing recomputes " +
                std::to_string(train.program->recomputed_nodes()) + " nodes in backward (" + name_list(recompute) + ")");
    else if (had_checkpointing_)
      host.warn("model '" + std::string(kId) + "': " + path_ +
                " was exported from a model with activation checkpointing enabled, which torch.export drops; "
                "ask kiln for it with [model] activation_checkpointing = [\"<module>.*\"]");
  }

  torch::nn::Module& module() override { return net_; }

  // Before anything runs: the data module's batches against the programs'
  // inputs (names, dtypes, shapes), then once through the evaluation
  // program, so that what does not fit exits 2 with both sides named.
  void check_batch(kiln::Split split, const kiln::Batch& batch) override {
    const Bound& b = bound_for(split);
    if (split == kiln::Split::predict && output_.empty()) refuse_predict();
    const std::vector<std::string> have = batch.names();
    for (size_t i = 0; i < b.batch.size(); ++i) {
      if (batch.has(b.batch[i])) continue;
      const bool same = b.batch[i] == b.inputs[i];
      throw kiln::InvalidInput("'" + path_ + "', program '" + b.name + "' takes input '" + b.inputs[i] + "'" +
                               (same ? "" : " (the batch's \"" + b.batch[i] + "\")") +
                               ", and the data module's batches have none (they have: " + name_list(have) +
                               "); name the batch's tensor with [model] inputs = { " + b.inputs[i] + " = \"...\" }");
    }
    if (split != kiln::Split::predict && loss_ != Loss::output && !batch.has(target_))
      throw kiln::InvalidInput("'" + path_ + "': the manifest's loss compares the output '" + output_ +
                               "' with the batch's \"" + target_ + "\", which the data module's batches lack (they have: " +
                               name_list(have) + "); name it with [model] target = \"...\"");
    std::vector<at::Tensor> inputs = gather(b, batch, /*check=*/true);
    b.program->check_inputs(inputs, /*any_batch_size=*/true);
    // Then the evaluation program on them (a dtype it cannot take).
    const Bound& e = bound_for(split == kiln::Split::train ? kiln::Split::val : split);
    inputs = gather(e, batch, true);
    const std::vector<at::Tensor> params = net_.parameters();
    for (auto& t : inputs)
      if (!params.empty() && t.device() != params[0].device()) t = t.to(params[0].device());
    std::string refused;
    try {
      at::NoGradGuard no_grad;
      e.program->run(inputs);
    } catch (const c10::Error& error) {
      refused = error.what_without_backtrace();
    } catch (const std::exception& error) {
      refused = error.what();
    }
    if (refused.empty()) return;
    refused = refused.substr(0, refused.find('\n'));
    std::string shapes;
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::string shape;
      for (int64_t d : inputs[i].sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      shapes += (shapes.empty() ? "" : ", ") + e.batch[i] + " [" + shape + "] " + c10::toString(inputs[i].scalar_type());
    }
    // A program traced in float32 records float32 casts (an RMSNorm's
    // .to(input_dtype)), which bfloat16 weights then meet.
    const at::ScalarType now = params.empty() ? at::kFloat : params[0].scalar_type();
    if (exported_dtype_ && *exported_dtype_ != now && at::isFloatingType(now))
      refused += std::string("; the program was exported in ") + c10::toString(*exported_dtype_) + " and runs in " +
                 c10::toString(now) + " here (trainer.precision): export the model in that dtype (model.to(torch." +
                 (now == at::kBFloat16 ? "bfloat16" : "float16") + ") before kiln_export.export)";
    throw kiln::InvalidInput("the model does not fit the data module's batches (" + shapes + "): " + refused);
  }

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    const Outputs out = run(batch, kiln::Split::train);
    if (loss_ == Loss::output) return scalar_loss(out);
    return manifest_loss(out.at(output_), batch[target_]);
  }
  void validation_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, kiln::Split::val, "val/"); }
  void test_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, kiln::Split::test, "test/"); }

  // Class probabilities; a language model's next token's at each prompt's
  // end; values as they are for mse.
  at::Tensor predict_step(const kiln::Batch& batch, int64_t) override {
    if (output_.empty()) refuse_predict();
    const Outputs out = run(batch, kiln::Split::predict);
    const at::Tensor& y = out.at(output_);
    if (loss_ == Loss::mse) return y;
    if (y.dim() == 3) return torch::softmax(y.select(1, y.size(1) - 1), /*dim=*/1);
    return torch::softmax(y, /*dim=*/1);
  }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    const Bound& b = bound_.at(net_.is_training() ? "train" : "eval");
    return b.program->run({input}).at(0);
  }

 private:
  enum class Loss { cross_entropy, mse, output };
  // A run's outputs by the program's names for them: found by a scan of a
  // few names, with no map built each step.
  struct Outputs {
    const std::vector<std::string>* names;
    std::vector<at::Tensor> values;
    const at::Tensor& at(const std::string& name) const {
      for (size_t i = 0; i < names->size(); ++i)
        if ((*names)[i] == name) return values[i];
      throw std::out_of_range("the program returns no output '" + name + "'");
    }
  };

  [[noreturn]] void refuse_predict() const {
    throw kiln::InvalidInput("'" + path_ + "': the program returns the loss only, and `kiln predict` has no "
                             "target: export the model's outputs (logits) to predict");
  }

  const Bound& bound_for(kiln::Split split) const {
    if (split == kiln::Split::train) return bound_.at("train");
    if (split == kiln::Split::predict && bound_.count("predict")) return bound_.at("predict");
    return bound_.at("eval");
  }

  // The batch's tensors in the program's order. A float program input takes
  // an integer tensor as floats (a uint8 image, integer features); an
  // integer input (token ids) is refused a float one, which would lose them.
  std::vector<at::Tensor> gather(const Bound& b, const kiln::Batch& batch, bool check) const {
    std::vector<at::Tensor> inputs;
    inputs.reserve(b.batch.size());
    const auto& dtypes = b.program->input_dtypes();
    for (size_t i = 0; i < b.batch.size(); ++i) {
      at::Tensor t = batch[b.batch[i]];
      const auto want = dtypes[i];
      if (want && t.scalar_type() != *want) {
        if (check && !c10::isFloatingType(*want) && c10::isFloatingType(t.scalar_type()))
          throw kiln::InvalidInput("'" + path_ + "', program '" + b.name + "' takes input '" + b.inputs[i] + "' as " +
                                   c10::toString(*want) + ", and the batch's \"" + b.batch[i] + "\" is " +
                                   c10::toString(t.scalar_type()) + ": store it as integers (token ids, a mask)");
        t = t.to(*want);
      }
      inputs.push_back(std::move(t));
    }
    return inputs;
  }

  Outputs run(const kiln::Batch& batch, kiln::Split split) const {
    if (!weights_copied_) copy_weights_out_of_file();
    const Bound& b = bound_for(split);
    return Outputs{&b.outputs, b.program->run(gather(b, batch, false))};
  }

  // The weights map the archive (mapped_weights.hpp) through the start-up,
  // where the host may read only part of each (sharded parameters); what
  // still maps it at the first step is copied into memory of its own, so a
  // file exported again in place meanwhile cannot change a weight mid-run.
  void copy_weights_out_of_file() const {
    for (const at::Tensor& t : net_.parameters()) kiln_exported::move_out_of_file(t);
    for (const at::Tensor& t : net_.buffers()) kiln_exported::move_out_of_file(t);
    weights_copied_ = true;
  }

  at::Tensor scalar_loss(const Outputs& out) const {
    const at::Tensor& loss = out.at(loss_output_);
    if (loss.numel() != 1)
      throw kiln::InvalidInput("'" + path_ + "': the program's \"" + loss_output_ + "\" has " +
                               std::to_string(loss.numel()) + " values; with loss = \"output\" it must be one, the loss");
    return loss.reshape({});
  }

  // The manifest's loss of the chosen output against the target: a
  // sequence's logits [N, T, V] against targets [N, T] at every position.
  at::Tensor manifest_loss(const at::Tensor& y, const at::Tensor& target) const {
    if (loss_ == Loss::mse) {
      if (y.numel() != target.numel())
        throw kiln::InvalidInput("'" + path_ + "': the program returns " + std::to_string(y.numel()) +
                                 " values for a batch whose target has " + std::to_string(target.numel()) +
                                 "; loss = \"mse\" compares them one to one");
      return torch::mse_loss(y.reshape(target.sizes()), target.to(y.scalar_type()));
    }
    if (target.dim() == 2)
      return torch::nn::functional::cross_entropy(y.reshape({-1, y.size(-1)}), labels(target).reshape({-1}));
    return torch::nn::functional::cross_entropy(y, labels(target));
  }

  void evaluate(const kiln::Batch& batch, kiln::Split split, const std::string& prefix) {
    const Outputs out = run(batch, split);
    const at::Tensor first = batch[bound_for(split).batch.empty() ? target_ : bound_for(split).batch[0]];
    const double rows = first.dim() > 0 ? static_cast<double>(first.size(0)) : 1.0;
    if (rows == 0) return;
    if (loss_ == Loss::output) return host().log_metric(prefix + "loss", scalar_loss(out).detach(), rows);
    const at::Tensor& y = out.at(output_);
    const at::Tensor target = batch[target_];
    if (loss_ == Loss::mse) return host().log_metric(prefix + "loss", manifest_loss(y, target).detach(), rows);
    if (target.dim() != 2) return evaluate_logits(y, target, prefix);
    // Per token.
    const at::Tensor flat_target = labels(target).reshape({-1});
    const at::Tensor flat = y.reshape({-1, y.size(-1)});
    const double tokens = static_cast<double>(flat_target.size(0));
    if (tokens == 0) return;
    host().log_metric(prefix + "loss", torch::nn::functional::cross_entropy(flat, flat_target), tokens);
    host().log_metric(prefix + "acc", flat.argmax(1).eq(flat_target).to(torch::kDouble).mean(), tokens);
  }

  std::string path_;
  Loss loss_ = Loss::cross_entropy;
  std::string loss_output_;  // with Loss::output
  std::string output_;       // what predictions and the manifest's loss read ("" : none)
  std::string target_;
  bool had_checkpointing_ = false;
  mutable bool weights_copied_ = false;  // out of the archive's mapping (at the first step)
  // The dtype its floating-point weights were exported in (the host may
  // have cast them since: trainer.precision = "bf16-true").
  std::optional<at::ScalarType> exported_dtype_;
  torch::nn::Module net_{"Exported"};
  std::map<std::string, Bound> bound_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Exported>({kId, "Exported program", "0.1.0",
                                              "A model written in Python, trained from its torch.export programs"}))
