// The character-level GPT (kiln_charlm) on kiln_token_stream, small and
// fast: text out of `kiln predict` (trainer.predictions_text), the same text
// from the same weights, and training on two processes. The real workload
// is tests/accuracy/charlm_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

// A tiny model on a short, very regular text: a few steps teach it something.
std::filesystem::path charlm_manifest(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the cat sat on the mat. ";
  write_file(dir / "text.txt", text);
  return write_run_manifest(
      dir, {.name = "charlm",
            .run = "seed = 1\nthreads = 1\n",
            .model = "path = \"kiln_charlm\"\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\nmax_new_tokens = 40\n",
            .data = "path = \"kiln_token_stream\"\nfile = \"" + (dir / "text.txt").string() +
                    "\"\nblock_size = 16\nval_fraction = 0.1\npredict_samples = 3\n",
            .trainer = trainer_keys(2, 16, "limit_train_batches = 30\n"),
            .optimizer = "name = \"adamw\"\nlr = 0.01\n",
            .extra = "\n[checkpoint]\n"});
}

int rows_in(const std::string& text) {
  int rows = 0;
  for (size_t at = text.find("--- row "); at != std::string::npos; at = text.find("--- row ", at + 1)) ++rows;
  return rows;
}

TEST(CharLm, PredictWritesTheGeneratedBytesAsTextTheSameEachTime) {
  TempDir dir;
  const auto manifest = charlm_manifest(dir);
  ProcessResult r = kiln({"fit", manifest.string()}, {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  const double bpc = last_value(rows, "val/bpc");
  EXPECT_LT(bpc, 8.0) << "below a uniform guess over 256 bytes";
  EXPECT_NEAR(bpc, last_value(rows, "val/loss") / std::log(2.0), 1e-4);

  std::string first;
  for (int run = 0; run < 2; ++run) {
    r = kiln({"predict", manifest.string(), "--ckpt", "last", "--set", "trainer.predictions_text=true"},
             {.timeout = kTimeout});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string text = read_file(dir / "run" / "predictions.txt");
    // 3 prompts, 40 bytes each, each under its own line.
    EXPECT_EQ(rows_in(text), 3) << text;
    EXPECT_EQ(text.size(), 3 * (40 + 1) + std::string("--- row 0 ---\n").size() * 3) << text;
    EXPECT_TRUE(std::filesystem::exists(dir / "run" / "predictions.pt"));
    if (run == 0) first = text;
    else EXPECT_EQ(text, first) << "the model's seed fixes the samples";
  }
}

// A uint8 tensor is not always text: outputs of another kind are refused,
// naming the key, before predictions.pt is written.
// kiln_charlm checks the data's first samples before anything runs (ABI
// 1.5's check_batch): a context longer than its block_size, or a token
// outside its vocabulary, is exit 2 naming both, with nothing written; a
// prompt longer than block_size is fine for `kiln predict` (generation keeps
// its last block_size tokens).
TEST(CharLm, ADataContextLongerThanBlockSizeOrATokenOutsideTheVocabularyIsRefusedAtStart) {
  TempDir dir;
  const auto manifest = charlm_manifest(dir);
  ProcessResult r = kiln({"fit", manifest.string(), "--set", "data.block_size=32"}, {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the data's context is 32 tokens, longer than the model's block_size = 16"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << r.output;
  r = kiln({"fit", manifest.string(), "--set", "model.vocab_size=100"}, {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("outside the model's vocabulary (vocab_size = 100)"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << r.output;
  r = kiln({"fit", manifest.string(), "--set", "trainer.max_steps=2"}, {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = kiln({"predict", manifest.string(), "--ckpt", "last", "--set", "data.prompt_tokens=40"}, {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CharLm, PredictionsTextRefusesOutputsThatAreNotBytes) {
  TempDir dir;
  const auto manifest = synthetic_manifest(dir);
  const ProcessResult r =
      kiln({"predict", manifest.string(), "--set", "trainer.predictions_text=true"}, {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("trainer.predictions_text"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Float"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "predictions.pt"));
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "predictions.txt"));
}

// Uniform random bytes: the next byte cannot be predicted, so a correct model
// stays at 8 bits per byte on held-out bytes. A model that sees its target
// (the data's shift by one lost, or attention reaching the future) drops far
// below.
TEST(CharLm, RandomBytesStayAtEightBitsSoNothingLeaksTheTarget) {
  TempDir dir;
  const auto manifest = charlm_manifest(dir);
  std::string bytes(20000, '\0');
  uint64_t x = 88172645463325252ull;  // xorshift64: any fixed sequence will do
  for (char& b : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<char>(x >> 56);
  }
  write_file(dir / "text.txt", bytes);
  const ProcessResult r = kiln({"fit", manifest.string(), "--set", "trainer.max_epochs=4", "--set",
                                "trainer.limit_train_batches=50"},
                               {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(last_value(read_metrics(dir / "run" / "metrics.csv"), "val/bpc"), 7.9) << r.output;
}

// The host shards the windows across ranks; the model trains the same way.
TEST(CharLm, TrainsOnTwoProcesses) {
  TempDir dir;
  const auto manifest = charlm_manifest(dir);
  const ProcessResult r = kiln({"fit", manifest.string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  EXPECT_EQ(last_value(rows, "step"), 60);
  EXPECT_LT(last_value(rows, "val/bpc"), 8.0);
}

}  // namespace
}  // namespace kiln::test
