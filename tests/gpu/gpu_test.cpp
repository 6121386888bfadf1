// What needs a CUDA device: training on it in each precision, the scaler's
// state in a 16-mixed checkpoint, an asynchronous commit of CUDA tensors, a
// device index past the machine's refused, and a training step that does not
// wait for the GPU. CTest label `gpu`.
// Without a device (or with a LibTorch without CUDA) every test skips with
// the same one line, and CTest reports it as skipped, never as passed.
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include "../integration/common.hpp"
#include "../unit/loop_fakes.hpp"
#include "../integration/checkpoint_sections.hpp"
#include "ckpt/checkpoint_file.hpp"

namespace kiln::test {
namespace {

class Gpu : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available())
      GTEST_SKIP() << "no CUDA device visible to this process (or LibTorch without CUDA): GPU test not run";
  }
};

// The synthetic MLP run of the integration tests, on the GPU, in `precision`.
ProcessResult fit_on_gpu(const TempDir& dir, const std::string& precision, std::vector<std::string> more = {},
                         const std::string& extra = "") {
  std::vector<std::string> args{"fit", synthetic_manifest(dir, extra).string(), "--set", "run.device=cuda", "--set",
                                "trainer.precision=" + precision};
  args.insert(args.end(), more.begin(), more.end());
  return kiln(args, {.timeout = std::chrono::seconds(300)});
}

TEST_F(Gpu, TrainsOnCudaInEachPrecision) {
  for (const char* precision : {"32", "bf16-mixed", "16-mixed"}) {
    TempDir dir;
    const ProcessResult r = fit_on_gpu(dir, precision);
    ASSERT_EQ(r.exit_code, 0) << precision << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string("device cuda:0, precision ") + precision), std::string::npos) << r.output;
    const auto rows = read_metrics(dir / "run" / "metrics.csv");
    ASSERT_EQ(rows.size(), 3u) << precision;
    EXPECT_LT(rows.back().at("train/loss"), rows.front().at("train/loss")) << precision;
  }
}

TEST_F(Gpu, Float16MixedCheckpointsCarryTheScalerAndResume) {
  TempDir dir;
  ProcessResult r = fit_on_gpu(dir, "16-mixed", {"--set", "trainer.max_epochs=2"}, "[checkpoint]\nevery_n_epochs = 1\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CheckpointFile file = CheckpointFile::read(dir / "run" / "checkpoints" / "last.ckpt");
  ASSERT_TRUE(file.has("amp/scaler"));
  EXPECT_EQ(std::string(file.section("amp/scaler")).rfind("scale ", 0), 0u);
  r = fit_on_gpu(dir, "16-mixed", {"--resume", "last"}, "[checkpoint]\nevery_n_epochs = 1\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("16-mixed:"), std::string::npos) << r.output;
}

// The asynchronous snapshot of CUDA tensors is a pinned, non-blocking copy
// ordered by an event (ckpt/snapshot): a file written from it before the
// copy landed, or after the next steps changed the parameters, would differ
// from the synchronous run's file for the same step.
TEST_F(Gpu, AnAsynchronousCommitOfCudaTensorsHoldsTheSameStateAsTheSynchronousOne) {
  const std::string every_three_steps =
      "\n[checkpoint]\nevery_n_steps = 3\nevery_n_epochs = 0\nsave_top_k = -1\n";
  for (const char* precision : {"32", "bf16-mixed"}) {
    SCOPED_TRACE(precision);
    TempDir sync_dir, async_dir;
    for (const auto& [dir, async] : {std::pair<const TempDir&, const char*>{sync_dir, "false"}, {async_dir, "true"}}) {
      const ProcessResult r = fit_on_gpu(dir, precision,
                                         {"--set", std::string("checkpoint.async=") + async, "--set",
                                          "trainer.max_steps=40", "--set", "model.dropout=0.2"},
                                         every_three_steps);
      ASSERT_EQ(r.exit_code, 0) << "async " << async << "\n" << r.output;
    }
    const auto dir_of = [](const TempDir& d) { return d / "run" / "checkpoints"; };
    size_t files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_of(sync_dir))) {
      const auto name = entry.path().filename();
      SCOPED_TRACE(name.string());
      ++files;
      const auto expected = state_sections(entry.path());
      const auto written = state_sections(dir_of(async_dir) / name);
      std::string differ;
      for (const auto& [section, bytes] : expected)
        if (auto it = written.find(section); it == written.end() || it->second != bytes) differ += " " + section;
      EXPECT_EQ(differ, "") << "the asynchronous commit wrote other bytes than the state at its boundary "
                               "(or training on this GPU is not deterministic run to run)";
    }
    EXPECT_EQ(files, 13u + 1u) << "steps 3, 6, ..., 39 and last.ckpt";
  }
}

TEST_F(Gpu, ADeviceIndexPastTheMachinesIsRefused) {
  TempDir dir;
  const int devices = static_cast<int>(torch::cuda::device_count());
  const ProcessResult r = fit_on_gpu(dir, "32", {"--set", "run.device=cuda:" + std::to_string(devices)});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("this machine has " + std::to_string(devices) + " CUDA device"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

// On a real device: three epochs of training copy from the GPU three times
// (the metrics at each epoch end), not once per step, and never call item();
// the loss is recorded with the host's own TensorMetrics as a device value.
TEST_F(Gpu, TheTrainingStepDoesNotWaitForTheGpu) {
  Fit fit(3, -1, 1, 1, c10::Device(c10::kCUDA, 0));
  fit.model.has_val = fit.model.has_test = false;
  fit.metrics.on_device.emplace(/*defer_cpu=*/false);
  fit.clipping.value = 0.5;
  // Collected rows leave the device through pinned memory, non-blocking,
  // ordered by an event read at the epoch's end (metrics/collection).
  FakeCollector collector;
  fit.context.collector = &collector;
  fit.model.collect_into = &collector.collection;
  HostReads reads;
  const TrainPosition end = fit.run();
  EXPECT_EQ(text(end), "3/0/9");
  EXPECT_EQ(reads.count(), 0) << "no item() in the loop";
  EXPECT_EQ(collector.rows_per_epoch.size(), 3u);
  EXPECT_EQ(fit.metrics.on_device->device_reads(), 3) << "one copy of the metrics per epoch end";
}

// On CUDA the next batch's host-to-device copy is started before this
// batch's step, when a prefetch thread already has it. A get_batch that
// stalls on the next batch must not hold this batch's step back: the step
// fails while that call is stuck, and the failure is reported with every
// cleanup hook run, within a bound (the CPU case: StuckGetBatch).
TEST_F(Gpu, AStepThatFailsWhileTheNextGetBatchIsStuckIsReported) {
  TempDir dir;
  const ProcessResult r =
      kiln({"fit",
            recorder_manifest(dir, "fail_at = [\"training_step\"]\nwait_for = \"data:get_batch stalls\"",
                              "size = 64\nstall_after = 1\nstall_s = 600", "",
                              "max_epochs = 1\nbatch_size = 4\ndata_workers = 1\n")
                .string(),
            "--set", "run.device=cuda"},
           {.timeout = std::chrono::seconds(120)});
  ASSERT_FALSE(r.timed_out) << "the step waited for the next batch's stuck get_batch\n" << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("device cuda:0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed in training_step"), std::string::npos) << r.output;
  const std::string calls = read_file(dir / "calls.log");
  for (const char* line : {"get_batch stalls", "model:on_exception(", "data:teardown(failed=1)", "model:destroy"})
    EXPECT_NE(calls.find(line), std::string::npos) << line << "\n" << calls;
}

}  // namespace
}  // namespace kiln::test
