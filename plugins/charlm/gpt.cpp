#include "gpt.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace kiln_charlm {

namespace {

torch::nn::Linear linear(int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out)); }

torch::nn::LayerNorm layer_norm(const GptOptions& o) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.n_embd}));
}

// GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the
// projections back into the residual stream scaled by 1/sqrt(2 n_layer) so
// the stream's variance does not grow with depth. LibTorch's default
// (Kaiming-uniform) trains too, but markedly slower at this size.
void init_linear(torch::nn::Linear& layer, double std) {
  torch::NoGradGuard no_grad;
  layer->weight.normal_(0.0, std);
  if (layer->bias.defined()) layer->bias.zero_();
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptOptions& o) : n_head_(o.n_head), dropout_(o.dropout) {
  qkv_ = register_module("qkv", linear(o.n_embd, 3 * o.n_embd));
  proj_ = register_module("proj", linear(o.n_embd, o.n_embd));
  init_linear(qkv_, 0.02);
  init_linear(proj_, 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer)));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / n_head_;
  const std::vector<at::Tensor> qkv = qkv_->forward(x).split(c, /*dim=*/2);
  // [B, T, C] -> [B, heads, T, head_dim]
  auto heads = [&](const at::Tensor& m) { return m.view({b, t, n_head_, d}).transpose(1, 2); };
  const at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(d)));
  // Position i attends to positions <= i only: the future is masked out.
  const at::Tensor future = at::ones({t, t}, x.options().dtype(at::kBool)).triu_(1);
  att = att.masked_fill(future, -std::numeric_limits<float>::infinity()).softmax(-1);
  if (dropout_ > 0.0) att = torch::dropout(att, dropout_, is_training());
  at::Tensor y = at::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
  y = proj_->forward(y);
  if (dropout_ > 0.0) y = torch::dropout(y, dropout_, is_training());
  return y;
}

FeedForwardImpl::FeedForwardImpl(const GptOptions& o) : dropout_(o.dropout) {
  fc_ = register_module("fc", linear(o.n_embd, 4 * o.n_embd));
  proj_ = register_module("proj", linear(4 * o.n_embd, o.n_embd));
  init_linear(fc_, 0.02);
  init_linear(proj_, 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer)));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  at::Tensor y = proj_->forward(torch::gelu(fc_->forward(x)));
  if (dropout_ > 0.0) y = torch::dropout(y, dropout_, is_training());
  return y;
}

BlockImpl::BlockImpl(const GptOptions& o) {
  ln1_ = register_module("ln1", layer_norm(o));
  attn_ = register_module("attn", CausalSelfAttention(o));
  ln2_ = register_module("ln2", layer_norm(o));
  mlp_ = register_module("mlp", FeedForward(o));
}

// Pre-norm residual blocks (GPT-2): the residual stream itself is never
// normalised, which keeps deep stacks trainable without warm-up tricks.
at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor y = x + attn_->forward(ln1_->forward(x));
  return y + mlp_->forward(ln2_->forward(y));
}

GptImpl::GptImpl(const GptOptions& o) : options_(o) {
  wte_ = register_module("wte", torch::nn::Embedding(o.vocab_size, o.n_embd));
  wpe_ = register_module("wpe", torch::nn::Embedding(o.block_size, o.n_embd));
  blocks_ = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layer; ++i) blocks_->push_back(Block(o));
  ln_f_ = register_module("ln_f", layer_norm(o));
  torch::NoGradGuard no_grad;
  wte_->weight.normal_(0.0, 0.02);
  wpe_->weight.normal_(0.0, 0.02);
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  if (t > options_.block_size)
    throw std::invalid_argument("a batch of " + std::to_string(t) + " tokens per row is longer than block_size = " +
                                std::to_string(options_.block_size) +
                                "; give the model a block_size at least the data's");
  const at::Tensor positions = at::arange(t, tokens.options().dtype(at::kLong));
  at::Tensor x = wte_->forward(tokens) + wpe_->forward(positions);
  if (options_.dropout > 0.0) x = torch::dropout(x, options_.dropout, is_training());
  for (const auto& block : *blocks_) x = block->as<Block>()->forward(x);
  x = ln_f_->forward(x);
  // Tied output layer: the token embedding, transposed. Not a second module
  // sharing the tensor: the host would see the parameter twice.
  return at::matmul(x, wte_->weight.t());
}

}  // namespace kiln_charlm
