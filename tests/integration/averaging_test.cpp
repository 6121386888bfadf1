// [averaging] (issue 23): EMA and SWA weights kept by the host — exact
// across a resume, identical on every rank, and what `kiln export` writes.
// The closed-form EMA check is tests/unit/weight_averaging_test.cpp.
#include <gtest/gtest.h>

#include "integration/checkpoint_sections.hpp"
#include "integration/common.hpp"

namespace kiln::test {
namespace {

// A safetensors file's header (its JSON: names, shapes, metadata).
std::string safetensors_header(const std::filesystem::path& file) {
  const std::string bytes = read_file(file);
  if (bytes.size() < 8) return "";
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return bytes.substr(8, n);
}

ProcessResult export_checkpoint(const std::filesystem::path& ckpt, const std::filesystem::path& out,
                                std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"export", ckpt.string(), "-o", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return kiln(args, {.timeout = std::chrono::seconds(120)});
}

const char* kEma = "\n[averaging]\nkind = \"ema\"\ndecay = 0.9\n\n[checkpoint]\n";

// Two epochs straight, against one epoch then `--resume last` for the
// second: the same averaged weights, bit for bit.
TEST(Averaging, EmaResumedIsTheUninterruptedAverageAndIsExported) {
  TempDir whole, halves;
  const auto a = synthetic_manifest(whole, kEma);
  const auto b = synthetic_manifest(halves, kEma);
  ASSERT_EQ(kiln_fit(a, {"--set", "trainer.max_epochs=2"}).exit_code, 0);
  const ProcessResult first = kiln_fit(b, {"--set", "trainer.max_epochs=1"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult second = kiln_fit(b, {"--set", "trainer.max_epochs=2", "--resume", "last"});
  ASSERT_EQ(second.exit_code, 0) << second.output;

  const auto exported = [](const TempDir& dir, const char* name, std::vector<std::string> extra = {}) {
    const auto out = dir / name;
    const ProcessResult r = export_checkpoint(dir / "run" / "checkpoints" / "last.ckpt", out, std::move(extra));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  };
  const auto whole_avg = exported(whole, "avg.safetensors");
  const auto halves_avg = exported(halves, "avg.safetensors");
  EXPECT_EQ(read_file(whole_avg), read_file(halves_avg)) << "a resumed run's average is the uninterrupted one's";
  EXPECT_NE(safetensors_header(whole_avg).find("\"weights\":\"averaged\""), std::string::npos)
      << safetensors_header(whole_avg);
  const auto trained = exported(whole, "trained.safetensors", {"--trained-weights"});
  EXPECT_NE(safetensors_header(trained).find("\"weights\":\"trained\""), std::string::npos);
  EXPECT_NE(read_file(trained), read_file(whole_avg)) << "the average is not the trained weights";
}

// Two ranks: the same averaged weights (they become the model's at the end
// of the fit, and the recorder dumps the model's weights at teardown).
TEST(Averaging, EveryRankHoldsTheSameAverage) {
  for (const std::string kind : {"ema", "swa"}) {
    TempDir dir;
    const std::string model = "features = 4\ndump_params = \"" + (dir / "params").string() + "\"";
    const std::string extra = kind == "ema" ? "\n[averaging]\nkind = \"ema\"\ndecay = 0.5\n"
                                            : "\n[averaging]\nkind = \"swa\"\nstart_epoch = 1\nswa_lr = 0.01\n";
    const auto m = recorder_manifest(dir, model, "size = 32", "", "max_epochs = 3\nbatch_size = 4\n" + extra);
    const ProcessResult r = kiln_fit(m, {"-n", "2"}, std::chrono::seconds(180));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string rank0 = read_file(dir / "params.0"), rank1 = read_file(dir / "params.1");
    EXPECT_FALSE(rank0.empty());
    EXPECT_EQ(rank0, rank1) << kind;
  }
}

// SWA's average over epoch ends from start_epoch: the exported average is
// the mean of the trained weights at the ends of epochs 1 and 2 (checked
// with safetensors and torch); the learning rate is swa_lr from epoch 1 on
// (metrics.csv's lr column).
TEST(Averaging, SwaAveragesEpochEndsAndSetsItsRate) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto m = synthetic_manifest(
      dir, "\n[averaging]\nkind = \"swa\"\nstart_epoch = 1\nswa_lr = 0.002\n\n[checkpoint]\nsave_top_k = -1\n");
  const ProcessResult r = kiln_fit(m);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  ASSERT_GE(rows.size(), 3u);
  EXPECT_DOUBLE_EQ(rows[0].at("lr-Adam"), 0.01);
  EXPECT_DOUBLE_EQ(rows[1].at("lr-Adam"), 0.002);
  EXPECT_DOUBLE_EQ(rows[2].at("lr-Adam"), 0.002);
  const auto ckpts = dir / "run" / "checkpoints";
  const auto out = dir / "avg.safetensors";
  ASSERT_EQ(export_checkpoint(ckpts / "last.ckpt", out).exit_code, 0);
  EXPECT_NE(safetensors_header(out).find("\"weights\":\"averaged\""), std::string::npos);
  std::vector<std::filesystem::path> ends;
  for (const auto& entry : std::filesystem::directory_iterator(ckpts))
    if (entry.path().filename().string().rfind("epoch=", 0) == 0) ends.push_back(entry.path());
  std::sort(ends.begin(), ends.end());
  ASSERT_EQ(ends.size(), 3u);
  for (size_t e : {1, 2})
    ASSERT_EQ(export_checkpoint(ends[e], dir / ("end" + std::to_string(e) + ".safetensors"), {"--trained-weights"})
                  .exit_code,
              0);
  write_file(dir / "check.py",
             "import sys\nfrom safetensors.torch import load_file\n"
             "avg, e1, e2 = (load_file(f) for f in sys.argv[1:4])\n"
             "assert avg.keys() == e1.keys() and len(avg) > 0\n"
             "for k in avg:\n"
             "    d = (avg[k] - (e1[k] + e2[k]) / 2).abs().max().item()\n"
             "    assert d < 1e-6, (k, d)\n"
             "    assert (e1[k] - e2[k]).abs().max().item() > 0, k\n"
             "print('ok', len(avg))\n");
  const ProcessResult check = run_process({check_python().string(), (dir / "check.py").string(), out.string(),
                                           (dir / "end1.safetensors").string(), (dir / "end2.safetensors").string()});
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// The fit's last validation ran on the averaged weights; `kiln validate
// --ckpt last` of the same run must evaluate the same average and so log the
// same val/loss, to the last digit.
TEST(Averaging, ValidateOfACheckpointEvaluatesItsAverage) {
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[averaging]\nkind = \"ema\"\ndecay = 0.9\n\n[checkpoint]\n");
  const ProcessResult fit = kiln_fit(m, {"--set", "trainer.max_epochs=2"});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const double fit_loss = last_value(read_metrics(dir / "run" / "metrics.csv"), "val/loss");
  std::filesystem::remove(dir / "run" / "metrics.csv");
  const ProcessResult validate =
      kiln({"validate", m.string(), "--ckpt", "last", "--set", "trainer.max_epochs=2"}, {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(validate.exit_code, 0) << validate.output;
  EXPECT_NE(validate.output.find("averaging: evaluating the checkpoint's ema weights"), std::string::npos)
      << validate.output;
  EXPECT_EQ(last_value(read_metrics(dir / "run" / "metrics.csv"), "val/loss"), fit_loss) << validate.output;
}

// An EMA is no mean of epoch ends: a run resumed with averaging.kind =
// "swa" from a checkpoint of an EMA run starts its average again, saying so,
// and its checkpoints say which kind they hold. `kiln validate` of the EMA
// checkpoint still evaluates that EMA, named as such.
TEST(Averaging, AResumeWithTheOtherKindStartsTheAverageAgain) {
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[averaging]\nkind = \"ema\"\n\n[checkpoint]\nsave_top_k = -1\n");
  ASSERT_EQ(kiln_fit(m, {"--set", "trainer.max_epochs=2"}).exit_code, 0);
  const auto ckpts = dir / "run" / "checkpoints";
  const auto ema = state_sections(ckpts / "last.ckpt");
  ASSERT_EQ(ema.at("average/kind"), "ema");
  ASSERT_NE(ema.at("average/count"), "0");
  const ProcessResult swa =
      kiln_fit(m, {"--resume", "last", "--set", "trainer.max_epochs=3", "--set", "averaging.kind=swa", "--set",
                   "averaging.start_epoch=0"});
  ASSERT_EQ(swa.exit_code, 0) << swa.output;
  EXPECT_NE(swa.output.find("averaging: the checkpoint's average is an ema one, this run's averaging.kind is 'swa', "
                            "which cannot continue it; the average starts again from the checkpoint's weights"),
            std::string::npos)
      << swa.output;
  const auto after = state_sections(ckpts / "last.ckpt");
  EXPECT_EQ(after.at("average/kind"), "swa");
  EXPECT_EQ(after.at("average/count"), "1") << "epoch 2's end alone, not the EMA's updates plus one";
  std::vector<std::filesystem::path> ends;
  for (const auto& entry : std::filesystem::directory_iterator(ckpts))
    if (entry.path().filename().string().rfind("epoch=0002", 0) == 0) ends.push_back(entry.path());
  ASSERT_EQ(ends.size(), 1u);
  const ProcessResult validate = kiln({"validate", m.string(), "--ckpt", ends[0].string(), "--set",
                                       "averaging.kind=swa", "--set", "averaging.start_epoch=0"},
                                      {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(validate.exit_code, 0) << validate.output;
  EXPECT_NE(validate.output.find("averaging: evaluating the checkpoint's ema weights"), std::string::npos)
      << validate.output;
}

// A fit stopped (max_steps) before SWA's first epoch end has no average:
// the run says so, and the export says its weights are the trained ones.
TEST(Averaging, SwaThatNeverAveragedSaysSoAndExportsTheTrainedWeights) {
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[averaging]\nkind = \"swa\"\nstart_epoch = 1\n\n[checkpoint]\n");
  const ProcessResult fit = kiln_fit(m, {"--set", "trainer.max_epochs=3", "--set", "trainer.max_steps=2"});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_NE(fit.output.find("averaging: SWA averaged no epoch's end (it starts at epoch 1, the fit ended in epoch 0): "
                            "the model keeps its trained weights"),
            std::string::npos)
      << fit.output;
  const auto out = dir / "w.safetensors";
  ASSERT_EQ(export_checkpoint(dir / "run" / "checkpoints" / "last.ckpt", out).exit_code, 0);
  EXPECT_NE(safetensors_header(out).find("\"weights\":\"trained\""), std::string::npos) << safetensors_header(out);
}

}  // namespace
}  // namespace kiln::test
