// A GPT-style decoder (the architecture of GPT-2 and nanoGPT, sized down):
// token and position embeddings, n_layer pre-norm blocks of causal
// self-attention and a GELU MLP, a final layer norm, and logits from the
// token embedding's own weights (tied, as GPT-2 does: fewer parameters and
// better small-data training). Written with torch::nn only; attention is
// matmul + masked softmax so it builds against LibTorch 1.13 and 2.x alike
// (1.13 has no scaled_dot_product_attention).
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace kiln_charlm {

struct GptOptions {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // the longest context: the position embedding's size
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptOptions& options);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t n_head_;
  double dropout_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const GptOptions& options);
  at::Tensor forward(const at::Tensor& x);

 private:
  double dropout_;
  torch::nn::Linear fc_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(FeedForward);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptOptions& options);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  FeedForward mlp_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptOptions& options);
  // Logits [B, T, vocab_size] of int64 tokens [B, T], T <= block_size.
  at::Tensor forward(const at::Tensor& tokens);
  const GptOptions& options() const { return options_; }

 private:
  GptOptions options_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace kiln_charlm
