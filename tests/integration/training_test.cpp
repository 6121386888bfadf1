// `kiln fit` really trains: loop features checked through the metrics.csv a
// real run writes, the plain-C data module, determinism, and the
// Fashion-MNIST accuracy targets.
#include <gtest/gtest.h>

#include <cmath>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(600);

ProcessResult fit(const std::filesystem::path& manifest, std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"fit", manifest.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return kiln(args, {.timeout = kTimeout});
}

// What kiln_fashion_mnist hands the model is PyTorch's own arithmetic on the
// IDX file to the bit: x / 255 as torchvision's ToTensor computes it
// (u8.float().div(255)) and as torch.div(u8, 255.0) does, and with
// normalize = true, that minus 0.2860 divided by 0.3530. The labels are the
// file's. Checked with the PyTorch kiln was built against. A batch of 128 at
// 2 threads takes the path that shares a batch's rows between threads.
TEST(Training, FashionMnistBatchesArePyTorchsArithmeticToTheBit) {
  KILN_REQUIRE_CHECK_PYTHON();
  struct Case {
    bool normalize;
    int threads;
    int rows;
  };
  for (const Case c : {Case{false, 1, 32}, Case{true, 1, 32}, Case{false, 2, 128}}) {
    SCOPED_TRACE(std::string(c.normalize ? "normalize" : "x / 255") + ", " + std::to_string(c.threads) +
                 " thread(s), batches of " + std::to_string(c.rows));
    TempDir dir;
    const std::string recorder = (test_plugin_dir() / "libkiln_test_recorder.so").string();
    write_run_manifest(dir, {.name = "",
                             .run = "threads = " + std::to_string(c.threads) + "\n",
                             .model = "path = \"" + recorder + "\"\nid = \"test.recorder_model\"\nlog = \"" +
                                      (dir / "calls.log").string() + "\"\nfeatures = 784\nclasses = 10\ndump_inputs = \"" +
                                      (dir / "inputs").string() + "\"\n",
                             .data = std::string("path = \"kiln_fashion_mnist\"\nval_size = 0\nnormalize = ") +
                                     (c.normalize ? "true" : "false") + "\n",
                             .trainer = trainer_keys(1, c.rows, "max_steps = 3\nshuffle = false\nnum_sanity_val_steps = 0\n"),
                             .optimizer = ""});
    const ProcessResult r = kiln_fit(dir / "run.toml");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    write_file(dir / "check.py", R"(import gzip, sys, torch
dump, normalize, rows = open(sys.argv[1], "rb").read(), sys.argv[2] == "1", int(sys.argv[3])
root = "/usr/share/datasets/fashion-mnist/"
images = gzip.open(root + "train-images-idx3-ubyte.gz").read()[16:]
labels = gzip.open(root + "train-labels-idx1-ubyte.gz").read()[8:]
n = rows * 3
assert len(dump) == n * (784 * 4 + 8), len(dump)
u8 = torch.frombuffer(bytearray(images[:n * 784]), dtype=torch.uint8).reshape(n, 784)
refs = [u8.float().div(255), torch.div(u8, 255.0)]
if normalize:
    refs = [x.sub(0.2860).div(0.3530) for x in refs]
at = 0
for b in range(3):
    x = torch.frombuffer(bytearray(dump[at:at + rows * 784 * 4]), dtype=torch.float32).reshape(rows, 784)
    at += rows * 784 * 4
    y = torch.frombuffer(bytearray(dump[at:at + rows * 8]), dtype=torch.int64)
    at += rows * 8
    for ref in refs:
        assert torch.equal(x.view(torch.int32), ref[b * rows:(b + 1) * rows].contiguous().view(torch.int32)), b
    assert y.tolist() == list(labels[b * rows:(b + 1) * rows]), b
print("ok", torch.__version__)
)");
    const ProcessResult check = run_process({check_python().string(), (dir / "check.py").string(),
                                             (dir / "inputs.0").string(), c.normalize ? "1" : "0",
                                             std::to_string(c.rows)});
    EXPECT_EQ(check.exit_code, 0) << check.output;
  }
}

TEST(Training, SyntheticDataIsLearned) {
  TempDir dir;
  const ProcessResult r = fit(synthetic_manifest(dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_LT(rows.back().at("train/loss"), rows.front().at("train/loss"));
  EXPECT_GT(rows.back().at("val/acc"), 0.9) << r.output;
  // 1024 samples / 32 per batch = 32 steps an epoch.
  EXPECT_EQ(rows.back().at("step"), 96);
}

TEST(Training, PlainCDataModuleTrainsThroughDLPack) {
  TempDir dir;
  // Swapping the data module is the [data] path line (and its own keys).
  const ProcessResult r = fit(synthetic_manifest(dir), {"--set", "data.path=kiln_example_c_blobs", "--set",
                                                        "data.features=32", "--set", "data.classes=4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_GT(rows.back().at("val/acc"), 0.8) << r.output;
}

TEST(Training, SameSeedGivesIdenticalRuns) {
  TempDir a, b;
  ASSERT_EQ(fit(synthetic_manifest(a), {"--set", "run.deterministic=true"}).exit_code, 0);
  ASSERT_EQ(fit(synthetic_manifest(b), {"--set", "run.deterministic=true"}).exit_code, 0);
  auto strip_time = [](std::vector<std::map<std::string, double>> rows) {
    for (auto& row : rows) erase_timings(row);
    return rows;
  };
  EXPECT_EQ(strip_time(read_metrics(a / "run" / "metrics.csv")), strip_time(read_metrics(b / "run" / "metrics.csv")));
  TempDir c;
  ASSERT_EQ(fit(synthetic_manifest(c), {"--set", "run.seed=4"}).exit_code, 0);
  EXPECT_NE(read_metrics(a / "run" / "metrics.csv")[0].at("train/loss"),
            read_metrics(c / "run" / "metrics.csv")[0].at("train/loss"));
}

TEST(Training, AccumulationAndLimitsDecideTheStepCount) {
  TempDir dir;
  // 5 batches an epoch, 2 per optimizer step: steps 3 per epoch (the last
  // partial accumulation still steps).
  const ProcessResult r = fit(synthetic_manifest(dir), {"--set", "trainer.limit_train_batches=5", "--set",
                                                        "trainer.accumulate_grad_batches=2", "--set",
                                                        "trainer.max_epochs=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("step"), 3);
  EXPECT_EQ(rows[1].at("step"), 6);
}

TEST(Training, MaxStepsStopsMidEpoch) {
  TempDir dir;
  const ProcessResult r = fit(synthetic_manifest(dir), {"--set", "trainer.max_steps=40", "--set", "trainer.max_epochs=-1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 2u);  // 32 steps, then 8 more
  EXPECT_EQ(rows.back().at("step"), 40);
}

TEST(Training, FastDevRunRunsNBatchesOfEachSplitOnce) {
  TempDir dir;
  const ProcessResult r = fit(synthetic_manifest(dir), {"--set", "trainer.fast_dev_run=2", "--set",
                                                        "trainer.test_after_fit=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_EQ(rows.size(), 2u);  // one epoch, one test row
  EXPECT_EQ(rows[0].at("step"), 2);
  EXPECT_TRUE(rows[1].count("test/acc"));
}

TEST(Training, GradientClippingChangesTheTrajectory) {
  TempDir plain, by_norm, by_value;
  const std::vector<std::string> common{"--set", "trainer.max_epochs=1", "--set", "optimizer.name=sgd", "--set",
                                        "optimizer.lr=0.5"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  ASSERT_EQ(fit(synthetic_manifest(plain), with({})).exit_code, 0);
  ASSERT_EQ(fit(synthetic_manifest(by_norm), with({"--set", "trainer.gradient_clip_val=0.01"})).exit_code, 0);
  ASSERT_EQ(fit(synthetic_manifest(by_value),
                with({"--set", "trainer.gradient_clip_val=0.0001", "--set", "trainer.gradient_clip_algorithm=value"}))
                .exit_code,
            0);
  const double l0 = read_metrics(plain / "run" / "metrics.csv")[0].at("train/loss");
  const double l1 = read_metrics(by_norm / "run" / "metrics.csv")[0].at("train/loss");
  const double l2 = read_metrics(by_value / "run" / "metrics.csv")[0].at("train/loss");
  // Tiny clips slow SGD down: the epoch's mean loss stays higher.
  EXPECT_GT(l1, l0);
  EXPECT_GT(l2, l0);
}

TEST(Training, SchedulersAndOptimizersRun) {
  for (const auto& [optimizer, scheduler] : std::vector<std::pair<std::string, std::string>>{
           {"sgd", "step"}, {"adamw", "cosine"}, {"adam", "linear_warmup"}}) {
    TempDir dir;
    const ProcessResult r =
        fit(synthetic_manifest(dir), {"--set", "optimizer.name=" + optimizer, "--set", "scheduler.name=" + scheduler,
                                      "--set", "scheduler.interval=step", "--set", "scheduler.warmup_steps=10"});
    EXPECT_EQ(r.exit_code, 0) << optimizer << "/" << scheduler << "\n" << r.output;
  }
}

TEST(Training, EarlyStoppingCallbackStopsTheRun) {
  TempDir dir;
  // lr 0 leaves val/loss unchanged: no improvement, so patience 1 stops the
  // run after the second validation.
  const auto manifest = synthetic_manifest(
      dir, "\n[[callbacks]]\npath = \"kiln_early_stopping\"\nmonitor = \"val/loss\"\npatience = 1\n");
  const ProcessResult r = fit(manifest, {"--set", "optimizer.name=sgd", "--set", "optimizer.lr=1e-30", "--set",
                                         "trainer.max_epochs=10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("early stopping"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("never checked"), std::string::npos) << r.output;
  EXPECT_EQ(read_metrics(dir / "run" / "metrics.csv").size(), 2u) << r.output;

  // With no validation split it has nothing to check: the fit says so at
  // its end instead of passing for a run that never needed to stop.
  TempDir no_val;
  const ProcessResult unchecked =
      fit(synthetic_manifest(no_val, "\n[[callbacks]]\npath = \"kiln_early_stopping\"\nmonitor = \"val/loss\"\n"),
          {"--set", "data.val_size=0", "--set", "trainer.max_epochs=2"});
  ASSERT_EQ(unchecked.exit_code, 0) << unchecked.output;
  EXPECT_NE(unchecked.output.find("early stopping never checked 'val/loss': the fit ran 2 epochs and no validation"),
            std::string::npos)
      << unchecked.output;
}

TEST(Training, ValidateTestAndPredictCommands) {
  TempDir dir;
  const auto manifest = synthetic_manifest(dir);
  for (const char* command : {"validate", "test", "predict"}) {
    const ProcessResult r = kiln({command, manifest.string()}, {.timeout = kTimeout});
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  }
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  EXPECT_TRUE(rows.back().count("test/acc"));
  // 256 test samples x 4 classes, as a pickled tensor.
  EXPECT_GT(std::filesystem::file_size(dir / "run" / "predictions.pt"), 256u * 4u * 4u);
}

}  // namespace
}  // namespace kiln::test
