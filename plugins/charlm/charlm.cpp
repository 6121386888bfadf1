// kiln.charlm — a small GPT-style language model over tokens (bytes, for a
// character-level model): see gpt.hpp for the network. It reads the batches
// of kiln.token_stream: "input" and "target" int64 [N, T].
//
// [model]
// path = "kiln_charlm"
// vocab_size = 256      # 256: every byte is a token
// block_size = 128      # the longest context (>= the data's block_size)
// n_layer = 4
// n_head = 4            # must divide n_embd
// n_embd = 128
// dropout = 0.0
// # `kiln predict`: what to generate after each prompt
// max_new_tokens = 200
// temperature = 0.8     # 0 = greedy
// top_k = 0             # 0 = sample from every token
// seed = 0              # the draws; the same text for the same weights
//
// Before anything runs it checks the data's first samples (ABI 1.5's
// check_batch): a context longer than block_size or a token id outside
// vocab_size is refused, exit 2 (`kiln predict`'s prompts may be longer:
// generation keeps their last block_size tokens).
//
// Metrics: train/loss, val/loss and test/loss are cross-entropies in nats
// per token; */bpc is the same in bits (loss / ln 2: bits per character when
// tokens are bytes), the usual unit for character models.
// predict_step returns the generated tokens, one row per prompt: uint8 when
// vocab_size <= 256 (bytes: `[trainer] predictions_text = true` makes
// `kiln predict` write them as text too), else int64.
#include <cmath>
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "generate.hpp"
#include "gpt.hpp"
#include "kiln/metrics.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"

namespace {

constexpr const char* kId = "kiln.charlm";
const double kLn2 = std::log(2.0);

// splitmix64's finaliser: one well-mixed seed per (seed, batch) so batches
// draw independent streams.
uint64_t mix(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + (stream + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class CharLm final : public kiln::Model {
 public:
  CharLm(const kiln::Host& host, kiln::Config& config) : Model(host) {
    using kiln_plugins::non_negative;
    using kiln_plugins::positive;
    kiln_charlm::GptOptions o;
    o.vocab_size = positive("vocab_size", config.get<int64_t>("vocab_size", 256));
    o.block_size = positive("block_size", config.get<int64_t>("block_size", 128));
    o.n_layer = positive("n_layer", config.get<int64_t>("n_layer", 4));
    o.n_head = positive("n_head", config.get<int64_t>("n_head", 4));
    o.n_embd = positive("n_embd", config.get<int64_t>("n_embd", 128));
    if (o.n_embd % o.n_head != 0)
      throw kiln::ConfigError("'n_head' = " + std::to_string(o.n_head) + " does not divide 'n_embd' = " +
                              std::to_string(o.n_embd) + "; each head gets n_embd / n_head dimensions");
    o.dropout = kiln_plugins::dropout_rate("dropout", config.get<double>("dropout", 0.0));
    sampling_.max_new_tokens = positive("max_new_tokens", config.get<int64_t>("max_new_tokens", 200));
    sampling_.temperature = non_negative("temperature", config.get<double>("temperature", 0.8));
    sampling_.top_k = non_negative("top_k", config.get<int64_t>("top_k", 0));
    // TOML integers are signed; any value is a usable seed.
    seed_ = static_cast<uint64_t>(config.get<int64_t>("seed", 0));
    // Built here, not in setup: the host seeds the generator right before
    // create, so the initial weights follow run.seed.
    net_ = kiln_charlm::Gpt(o);
  }

  torch::nn::Module& module() override { return *net_; }

#ifndef KILN_PLUGINS_WITHOUT_CHECK_BATCH  // tests' twin: the same model, never handed the probe
  // Before anything runs (ABI 1.5): the data module's first samples, so that
  // a context longer than block_size or a token outside the vocabulary is
  // refused with exit 2 before anything is written, not at the first step.
  void check_batch(kiln::Split split, const kiln::Batch& batch) override {
    if (!batch.has("input"))
      throw kiln::InvalidInput("the data module's batches have no \"input\" (token ids), which this model reads");
    const at::Tensor input = batch["input"];
    const kiln_charlm::GptOptions& o = net_->options();
    if (input.dim() != 2 || at::isFloatingType(input.scalar_type()) || input.scalar_type() == at::kBool)
      throw kiln::InvalidInput("\"input\" must be integer token ids [batch, context], not " +
                               std::string(c10::toString(input.scalar_type())) + " of " +
                               std::to_string(input.dim()) + " dimensions");
    // Prompts longer than block_size are fine: generation keeps their last
    // block_size tokens.
    if (split != kiln::Split::predict && input.size(1) > o.block_size)
      throw kiln::InvalidInput("the data's context is " + std::to_string(input.size(1)) +
                               " tokens, longer than the model's block_size = " + std::to_string(o.block_size) +
                               "; raise block_size or shorten the data's context");
    if (input.numel() > 0) {
      const int64_t low = input.min().item<int64_t>(), high = input.max().item<int64_t>();
      if (low < 0 || high >= o.vocab_size)
        throw kiln::InvalidInput("token id " + std::to_string(low < 0 ? low : high) +
                                 " is outside the model's vocabulary (vocab_size = " + std::to_string(o.vocab_size) +
                                 ")");
    }
    if (split == kiln::Split::predict) return;
    if (!batch.has("target") || batch["target"].sizes() != input.sizes())
      throw kiln::InvalidInput("the data module's batches need a \"target\" of the input's shape (the next tokens)");
  }
#endif

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    const at::Tensor loss = loss_of(batch);
    host().log_metric("train/bpc", loss.detach() / kLn2, static_cast<double>(batch["target"].numel()));
    return loss;
  }

  void validation_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, "val/"); }
  void test_step(const kiln::Batch& batch, int64_t) override { evaluate(batch, "test/"); }

  at::Tensor predict_step(const kiln::Batch& batch, int64_t batch_index) override {
    const at::Tensor tokens =
        kiln_charlm::generate(net_, batch["input"], sampling_, mix(seed_, static_cast<uint64_t>(batch_index)));
    return net_->options().vocab_size <= 256 ? tokens.to(at::kByte) : tokens;
  }

 private:
  // Mean cross-entropy per token, in nats.
  at::Tensor loss_of(const kiln::Batch& batch) {
    const at::Tensor logits = net_->forward(batch["input"]);
    const at::Tensor target = batch["target"];
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  }

  // Each sample's summed cross-entropy (float64, nats) and token count are
  // collected; the epoch's loss and bits per character are computed over
  // every held-out token at once in on_epoch_end, in sample order: exact,
  // and the same bits whatever the number of processes (docs/metrics.md).
  void evaluate(const kiln::Batch& batch, const std::string&) {
    const at::Tensor target = batch["target"];
    if (target.numel() == 0) return;
    const at::Tensor logits = net_->forward(batch["input"]);
    const at::Tensor nll = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    const int64_t samples = target.size(0);
    host().collect("nll", nll.to(at::kDouble).reshape({samples, -1}).sum(1));
    host().collect("tokens", at::full({samples}, target.numel() / samples, at::kLong));
  }

 public:
  void on_epoch_end(kiln::Split split, const kiln::Collected& rows) override {
    if (split == kiln::Split::train || rows.empty()) return;
    const std::string prefix = split == kiln::Split::val ? "val/" : "test/";
    const at::Tensor nll = rows["nll"], tokens = rows["tokens"];
    host().log_metric(prefix + "loss", nll.sum().item<double>() / tokens.sum().to(at::kDouble).item<double>());
    host().log_metric(prefix + "bpc", kiln::metrics::bits_per_token(nll, tokens));
  }

 private:

  kiln_charlm::Gpt net_{nullptr};
  kiln_charlm::SamplingOptions sampling_;
  uint64_t seed_ = 0;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<CharLm>({kId, "Character GPT", "0.1.0",
                                            "A small GPT-style language model over byte (or other) tokens"}))
