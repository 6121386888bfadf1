// distributed.shard = "optimizer" (ZeRO-1, optim/sharded_step.hpp) against
// the replicated path, with real processes: with the same reduction, the
// weights, the optimizer's whole state (gathered into the checkpoint) and
// the averaged weights after N steps are the replicated run's to the bit,
// at 2 processes and at 3 (which do not divide the parameters evenly), with
// AdamW, gradient clipping by the global norm, accumulation, parameter
// groups and EMA. The checkpoint has the replicated layout, so a run
// resumes it with another world size, sharded or not, exactly as it
// resumes a replicated run's.
#include <gtest/gtest.h>

#include "checkpoint_sections.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

std::filesystem::path manifest(const TempDir& dir, const std::string& name) {
  write_file(dir / (name + ".toml"),
             "[run]\nname = \"shard\"\ndir = \"" + (dir / name).string() +
                 "\"\nseed = 7\nthreads = 1\n\n[model]\npath = \"kiln_mlp\"\nin_features = 20\nhidden = [13, 7]\n"
                 "classes = 3\n\n[data]\npath = \"kiln_synthetic\"\nfeatures = 20\nclasses = 3\ntrain_size = 300\n"
                 "val_size = 60\ntest_size = 0\n\n[trainer]\nmax_epochs = 3\nbatch_size = 10\nprogress = \"none\"\n"
                 "data_workers = 0\naccumulate_grad_batches = 2\ngradient_clip_val = 0.05\n\n"
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

class Shard : public testing::TestWithParam<int> {};

TEST_P(Shard, TheOptimizerShardedOverRanksEndsAtTheReplicatedRunsWeightsAndState) {
  const int n = GetParam();
  TempDir dir;
  const ProcessResult replicated = kiln_fit(manifest(dir, "replicated"), {"-n", std::to_string(n)});
  ASSERT_EQ(replicated.exit_code, 0) << replicated.output;
  const ProcessResult sharded =
      kiln_fit(manifest(dir, "sharded"), {"-n", std::to_string(n), "--set", "distributed.shard=optimizer"});
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  // 20*13+13 + 13*7+7 + 7*3+3 = 395 values: rank 0 owns ceil(395 / n) of them.
  const std::string owns = "distributed.shard = optimizer: rank 0 holds the optimizer's state for " +
                           std::to_string((395 + n - 1) / n) + " of the 395 trained values";
  EXPECT_NE(sharded.output.find(owns), std::string::npos) << sharded.output;
  expect_same(trained_state(dir / "replicated"), trained_state(dir / "sharded"));
}

INSTANTIATE_TEST_SUITE_P(Processes, Shard, testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "Processes"; });

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
  expect_same(want, run("into_sharded", "none", "optimizer"));
  expect_same(want, run("out_of_sharded", "optimizer", "none"));
}

}  // namespace
}  // namespace kiln::test
