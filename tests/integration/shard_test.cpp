// distributed.shard = "optimizer" and "gradients" (ZeRO-1 and -2,
// optim/sharded_step.hpp) against the replicated path, with real processes
// on one host (gradients reduce-scattered in shared memory): with the same
// reduction order, the weights, the optimizer's whole state (gathered into
// the checkpoint) and the averaged weights after N steps are the replicated
// run's to the bit, at 2 processes and at 3 (which do not divide the
// parameters evenly), with AdamW, gradient clipping by value, accumulation
// (ZeRO-1), parameter groups and EMA. Where a bit cannot be kept, the test
// says why and how far: the global norm's rounding, and ZeRO-2's
// accumulation. The checkpoint has the replicated layout, so a run resumes
// it with another world size, sharded or not, exactly as it resumes a
// replicated run's.
#include <gtest/gtest.h>

#include <tuple>

#include <ATen/ATen.h>

#include "checkpoint_sections.hpp"
#include "ckpt/checkpoint_file.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

std::filesystem::path manifest(const TempDir& dir, const std::string& name) {
  write_file(dir / (name + ".toml"),
             "[run]\nname = \"shard\"\ndir = \"" + (dir / name).string() +
                 "\"\nseed = 7\nthreads = 1\n\n[model]\npath = \"kiln_mlp\"\nin_features = 20\nhidden = [13, 7]\n"
                 "classes = 3\n\n[data]\npath = \"kiln_synthetic\"\nfeatures = 20\nclasses = 3\ntrain_size = 300\n"
                 "val_size = 60\ntest_size = 0\n\n[trainer]\nmax_epochs = 3\nbatch_size = 10\nprogress = \"none\"\n"
                 "data_workers = 0\naccumulate_grad_batches = 2\ngradient_clip_val = 0.05\n"
                 "gradient_clip_algorithm = \"value\"\n\n"
                 "[optimizer]\nname = \"adamw\"\nlr = 0.01\nweight_decay = 0.01\n\n[[optimizer.groups]]\n"
                 "match = [\"*.bias\"]\nweight_decay = 0.0\n\n[averaging]\nkind = \"ema\"\n\n[checkpoint]\n");
  return dir / (name + ".toml");
}

// The last checkpoint's model, optimizer and average sections.
std::map<std::string, std::string> trained_state(const std::filesystem::path& run) {
  std::map<std::string, std::string> out;
  for (const char* prefix : {"param/", "buffer/", "optim/", "average/"})
    out.merge(sections(run / "checkpoints" / "last.ckpt", prefix));
  return out;
}

void expect_same(const std::map<std::string, std::string>& want, const std::map<std::string, std::string>& got) {
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(want.size(), got.size());
  for (const auto& [name, bytes] : want) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(it->second == bytes) << name << " differs";
  }
  for (const char* needed : {"optim/0/exp_avg", "optim/0/exp_avg_sq", "average/count"})
    EXPECT_EQ(want.count(needed), 1u) << needed;
}

std::vector<std::string> with_shard(std::vector<std::string> args, const std::string& mode) {
  args.insert(args.end(), {"--set", "distributed.shard=" + mode});
  return args;
}

bool tensor_section(const CheckpointFile& file, const std::string& name) {
  try {
    read_tensor_section(file, name);
    return true;
  } catch (const CheckpointError&) {
    return false;
  }
}

// Every tensor of the two checkpoints within `tolerance` of each other:
// |a - b| <= tolerance * (1 + |a|).
void expect_close(const std::filesystem::path& want_run, const std::filesystem::path& got_run, double tolerance) {
  const CheckpointFile want = CheckpointFile::read(want_run / "checkpoints" / "last.ckpt");
  const CheckpointFile got = CheckpointFile::read(got_run / "checkpoints" / "last.ckpt");
  const auto names = trained_state(want_run);
  ASSERT_EQ(names.size(), trained_state(got_run).size());
  ASSERT_FALSE(names.empty());
  const auto got_names = trained_state(got_run);
  for (const auto& [name, bytes] : names) {
    if (!tensor_section(want, name)) {  // a count, a kind: the same
      EXPECT_EQ(bytes, got_names.at(name)) << name;
      continue;
    }
    const at::Tensor a = read_tensor_section(want, name).to(at::kDouble);
    const at::Tensor b = read_tensor_section(got, name).to(at::kDouble);
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    const double worst = ((a - b).abs() / (1 + a.abs())).max().item<double>();
    EXPECT_LE(worst, tolerance) << name;
  }
}

struct ShardCase {
  int processes;
  const char* mode;
  int accumulate;
  const char* intra_host = "auto";  // gloo: the reduce-scatter is Gloo's all-reduce
};

void PrintTo(const ShardCase& c, std::ostream* out) {
  *out << c.processes << " processes, " << c.mode << ", accumulate " << c.accumulate << ", " << c.intra_host;
}

class Shard : public testing::TestWithParam<ShardCase> {};

TEST_P(Shard, TheShardedRunEndsAtTheReplicatedRunsWeightsAndState) {
  const ShardCase c = GetParam();
  const std::vector<std::string> args{"-n", std::to_string(c.processes), "--set",
                                      "trainer.accumulate_grad_batches=" + std::to_string(c.accumulate), "--set",
                                      std::string("distributed.intra_host=") + c.intra_host};
  TempDir dir;
  const ProcessResult replicated = kiln_fit(manifest(dir, "replicated"), args);
  ASSERT_EQ(replicated.exit_code, 0) << replicated.output;
  const ProcessResult sharded = kiln_fit(manifest(dir, "sharded"), with_shard(args, c.mode));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  const bool over_gloo = std::string(c.intra_host) == "gloo";
  EXPECT_EQ(sharded.output.find("the gradients are all-reduced (twice a reduce-scatter's traffic)") != std::string::npos,
            over_gloo)
      << sharded.output;
  // 20*13+13 + 13*7+7 + 7*3+3 = 395 values: rank 0 owns ceil(395 / n) of them.
  const std::string owns = std::string("distributed.shard = ") + c.mode + ": rank 0 holds the optimizer's state";
  const std::string count = " for " + std::to_string((395 + c.processes - 1) / c.processes) + " of the 395 trained values";
  EXPECT_NE(sharded.output.find(owns), std::string::npos) << sharded.output;
  EXPECT_NE(sharded.output.find(count), std::string::npos) << sharded.output;
  expect_same(trained_state(dir / "replicated"), trained_state(dir / "sharded"));
}

INSTANTIATE_TEST_SUITE_P(Processes, Shard,
                         testing::Values(ShardCase{2, "optimizer", 2}, ShardCase{3, "optimizer", 2},
                                         ShardCase{2, "gradients", 1}, ShardCase{3, "gradients", 1},
                                         ShardCase{2, "gradients", 1, "gloo"}),
                         [](const auto& info) {
                           return std::to_string(info.param.processes) + "Processes_" + info.param.mode +
                                  "_accumulate" + std::to_string(info.param.accumulate) + "_" + info.param.intra_host;
                         });

// Where a bit cannot be kept. Clipping by the global norm: the replicated
// step takes the norm of every whole gradient's norm; a sharded rank holds
// only its part, so the norm is the root of the ranks' summed squares, the
// same number rounded differently (float32: about 1e-7 relative, which
// Adam's steps carry into the weights at about that order). ZeRO-2 with
// accumulation: each micro-batch's gradients are reduced and their sums
// added, where the replicated run reduces the accumulated gradients once.
// 3 processes, so that shards split parameters and the sums have 3 terms.
// Measured: at most 5e-8 apart; a sharded run that skipped the clipping
// ends 2e-2 from the replicated one, so 1e-5 tells the two apart.
TEST(ShardedRoundingApart, ClippingByTheGlobalNormAndZero2AccumulationStayWithinFloatRounding) {
  TempDir dir;
  auto fit = [&](const std::string& name, std::vector<std::string> sets) {
    std::vector<std::string> args{"-n", "3"};
    for (auto& s : sets) args.insert(args.end(), {"--set", s});
    const ProcessResult r = kiln_fit(manifest(dir, name), args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  };
  fit("norm_replicated", {"trainer.gradient_clip_algorithm=norm"});
  fit("norm_zero1", {"trainer.gradient_clip_algorithm=norm", "distributed.shard=optimizer"});
  fit("norm_zero2", {"trainer.gradient_clip_algorithm=norm", "distributed.shard=gradients"});
  fit("acc_replicated", {});
  fit("acc_zero2", {"distributed.shard=gradients"});
  constexpr double kTolerance = 1e-5;
  expect_close(dir / "norm_replicated", dir / "norm_zero1", kTolerance);
  expect_close(dir / "norm_replicated", dir / "norm_zero2", kTolerance);
  expect_close(dir / "acc_replicated", dir / "acc_zero2", kTolerance);
}

// A checkpoint taken inside an epoch by 2 sharded processes (without
// accumulation, which another world size could not continue there), resumed by 3
// sharded ones, ends where the same continuation of a replicated run ends;
// so does a sharded run resuming a replicated run's checkpoint, and a
// replicated run resuming a sharded one's.
TEST(ShardedCheckpoints, ReshardToAnotherWorldSizeAndBetweenModes) {
  TempDir dir;
  const std::vector<std::string> stop{"-n", "2", "--set", "trainer.max_steps=9", "--set",
                                      "trainer.accumulate_grad_batches=1"};
  auto run = [&](const std::string& name, const std::string& first, const std::string& then) {
    const auto m = manifest(dir, name);
    const ProcessResult a = kiln_fit(m, with_shard(stop, first));
    EXPECT_EQ(a.exit_code, 0) << a.output;
    const ProcessResult b =
        kiln_fit(m, with_shard({"-n", "3", "--resume", "last", "--set", "trainer.accumulate_grad_batches=1"}, then));
    EXPECT_EQ(b.exit_code, 0) << b.output;
    return trained_state(dir / name);
  };
  const auto want = run("replicated", "none", "none");
  expect_same(want, run("sharded", "optimizer", "optimizer"));
  expect_same(want, run("zero2_into_zero1", "gradients", "optimizer"));
  expect_same(want, run("into_sharded", "none", "optimizer"));
  expect_same(want, run("out_of_sharded", "optimizer", "none"));
}

}  // namespace
}  // namespace kiln::test
