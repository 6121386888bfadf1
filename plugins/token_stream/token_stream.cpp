// kiln.token_stream — a language-model corpus: one memory-mapped file of
// tokens, cut into windows of block_size + 1 tokens. Batches are "input"
// int64 [N, block_size] (a window's first block_size tokens) and "target"
// int64 [N, block_size] (the same window shifted by one: target[t] is the
// token after input[t]).
//
// [data]
// path = "kiln_token_stream"
// file = "kjv.txt"         # required; relative to the directory kiln runs in
// token_bytes = 1          # 1: each byte is a token (uint8); 2: little-endian uint16
// block_size = 128         # tokens a window feeds the model
// val_fraction = 0.1       # the last val_fraction of the tokens; 0 = no val split
// predict_samples = 8      # prompts for `kiln predict`
// prompt_tokens = 0        # tokens per prompt; 0 = block_size
//
// Splits:
//   train    every window that starts in the first 1 - val_fraction of the
//            tokens (and ends there): sample i starts at token i. The host's
//            sampler draws them in a new random order each epoch, from
//            run.seed and the epoch, and shards them across ranks; an epoch
//            of every start would be ~len(file) windows, so bound it with
//            [trainer] limit_train_batches (e.g. 500 batches an epoch).
//   val      the last val_fraction, cut into consecutive windows (stride
//            block_size), so every validation token is predicted exactly once
//            (up to a short tail) and the validation loss is the loss of the
//            whole held-out text, the same at every epoch.
//   test     the val split: a stream has two parts, and `kiln test` on it
//            says how a checkpoint does on the held-out text.
//   predict  predict_samples prompts ("input" only) of prompt_tokens, spread
//            evenly over the val text (over the training text without one).
//
// The module never draws random numbers: which windows an epoch sees, in
// which order and on which rank, is the host's sampling, so a run is a pure
// function of run.seed and resumes mid-epoch exactly.
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"
#include "token_file.hpp"

namespace {

constexpr const char* kId = "kiln.token_stream";

// Where a split's samples start in the file, and how far apart.
struct Windows {
  int64_t first = 0;   // token index of sample 0
  int64_t stride = 1;  // tokens between consecutive samples
  int64_t count = 0;   // samples; 0 = the split is absent
};

class TokenStream final : public kiln::DataModule {
 public:
  TokenStream(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    using kiln_plugins::non_negative;
    using kiln_plugins::positive;
    file_ = config.require<std::string>("file");
    if (file_.empty()) throw kiln::ConfigError("'file' is empty; set it to a file of tokens");
    token_bytes_ = config.get<int64_t>("token_bytes", 1);
    if (token_bytes_ != 1 && token_bytes_ != 2)
      throw kiln::ConfigError("'token_bytes' must be 1 (uint8 tokens) or 2 (uint16), got " +
                              std::to_string(token_bytes_));
    block_size_ = positive("block_size", config.get<int64_t>("block_size", 128));
    val_fraction_ = config.get<double>("val_fraction", 0.1);
    if (!(val_fraction_ >= 0.0 && val_fraction_ < 1.0))
      throw kiln::ConfigError("'val_fraction' must be in [0, 1), got " + kiln_plugins::number(val_fraction_));
    predict_samples_ = non_negative("predict_samples", config.get<int64_t>("predict_samples", 8));
    prompt_tokens_ = non_negative("prompt_tokens", config.get<int64_t>("prompt_tokens", 0));
    if (prompt_tokens_ == 0) prompt_tokens_ = block_size_;
  }

  // Mapping costs nothing however large the file; the split arithmetic is
  // checked here so a block_size too long for the text fails before the run
  // writes anything.
  void setup(kiln::Stage) override {
    try {
      tokens_ = kiln_token_stream::TokenFile(file_, static_cast<int>(token_bytes_));
    } catch (const kiln_token_stream::TokenFileError& e) {
      // The file the user named is unusable: bad input, exit 2.
      throw kiln::InvalidInput(std::string(e.what()) + " (the [data] table's 'file')");
    }
    const int64_t total = tokens_.size();
    const int64_t val_tokens = static_cast<int64_t>(static_cast<double>(total) * val_fraction_);
    const int64_t train_tokens = total - val_tokens;
    const std::string need = "'block_size' = " + std::to_string(block_size_) + " needs windows of " +
                             std::to_string(block_size_ + 1) + " tokens";
    if (train_tokens < block_size_ + 1)
      throw kiln::ConfigError(need + ", but the training part of '" + file_ + "' has " +
                              std::to_string(train_tokens) + " (of " + std::to_string(total) +
                              "); use a smaller block_size or a longer file");
    train_ = {0, 1, train_tokens - block_size_};
    if (val_tokens > 0) {
      if (val_tokens < block_size_ + 1)
        throw kiln::ConfigError(need + ", but the val split of '" + file_ + "' (its last val_fraction = " +
                                kiln_plugins::number(val_fraction_) + ") has " + std::to_string(val_tokens) +
                                "; raise val_fraction or use a smaller block_size");
      val_ = {train_tokens, block_size_, (val_tokens - 1) / block_size_};
    } else {
      val_ = {};
    }
    // Prompts: predict_samples starts spread evenly over the held-out text.
    const int64_t source_first = val_tokens > 0 ? train_tokens : 0;
    const int64_t source_tokens = val_tokens > 0 ? val_tokens : total;
    if (predict_samples_ > 0 && source_tokens < prompt_tokens_)
      throw kiln::ConfigError("'prompt_tokens' = " + std::to_string(prompt_tokens_) + " is longer than the " +
                              (val_tokens > 0 ? "val split" : "text") + " of '" + file_ + "' (" +
                              std::to_string(source_tokens) + " tokens); use shorter prompts");
    const int64_t span = source_tokens - prompt_tokens_;
    predict_ = {source_first, predict_samples_ > 0 ? span / predict_samples_ : 0, predict_samples_};
    host().debug(file_ + ": " + std::to_string(total) + " tokens; train " + std::to_string(train_tokens) +
                 " (" + std::to_string(train_.count) + " windows), val " + std::to_string(val_tokens) + " (" +
                 std::to_string(val_.count) + " windows)");
  }

  void teardown(kiln::Stage, bool) override { tokens_ = kiln_token_stream::TokenFile(); }

  int64_t length(kiln::Split split) override { return select(split).count; }

  // Reads the read-only mapping only, hence KILN_DATA_CONCURRENT_GET_BATCH.
  kiln::TensorMap get_batch(kiln::Split split, const int64_t* indices, size_t count) override {
    const Windows& windows = select(split);
    const int64_t n = static_cast<int64_t>(count);
    for (int64_t i = 0; i < n; ++i)
      if (indices[i] < 0 || indices[i] >= windows.count)
        throw std::out_of_range("sample index " + std::to_string(indices[i]) + " is out of range for a split of " +
                                std::to_string(windows.count));
    if (split == kiln::Split::predict) {
      at::Tensor prompts = at::empty({n, prompt_tokens_}, at::kLong);
      int64_t* out = prompts.data_ptr<int64_t>();
      for (int64_t i = 0; i < n; ++i)
        tokens_.copy(windows.first + indices[i] * windows.stride, prompt_tokens_, out + i * prompt_tokens_);
      return {{"input", prompts}};
    }
    const int64_t width = block_size_ + 1;
    at::Tensor rows = at::empty({n, width}, at::kLong);
    int64_t* out = rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      tokens_.copy(windows.first + indices[i] * windows.stride, width, out + i * width);
    return {{"input", rows.narrow(1, 0, block_size_).contiguous()},
            {"target", rows.narrow(1, 1, block_size_).contiguous()}};
  }

 private:
  const Windows& select(kiln::Split split) const {
    switch (split) {
      case kiln::Split::train: return train_;
      case kiln::Split::val:
      case kiln::Split::test: return val_;
      case kiln::Split::predict: return predict_;
    }
    throw std::invalid_argument("unknown split " + std::to_string(static_cast<int>(split)));
  }

  std::string file_;
  int64_t token_bytes_ = 1;
  int64_t block_size_ = 0;
  double val_fraction_ = 0.0;
  int64_t predict_samples_ = 0;
  int64_t prompt_tokens_ = 0;
  kiln_token_stream::TokenFile tokens_;
  Windows train_, val_, predict_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<TokenStream>(
    {kId, "Token stream", "0.1.0",
     "Windows of a memory-mapped file of uint8 or uint16 tokens, for language models",
     KILN_DATA_CONCURRENT_GET_BATCH}))
