// Optimizer parameter groups and the RMSprop / Adagrad entries, with real
// runs: a group's options reach its parameters, groups survive resume
// bitwise, and a resume whose groups differ from the checkpoint's is refused.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "ckpt/checkpoint_file.hpp"
#include "checkpoint_sections.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

// A deterministic run of the MLP (fc1.weight, fc1.bias, fc2.weight,
// fc2.bias) with checkpoints; `optimizer` is the [optimizer] table's lines
// and any [[optimizer.groups]] after it.
std::filesystem::path groups_manifest(const TempDir& dir, const std::string& optimizer,
                                      const std::string& checkpoint = "every_n_epochs = 1") {
  return write_run_manifest(
      dir, {.name = "groups",
            .run = "seed = 3\nthreads = 1\ndeterministic = true\n",
            .model = mlp_keys(32, "[32]", 4) + "dropout = 0.2\n",
            .trainer = trainer_keys(2, 32),
            .optimizer = optimizer + "\n",
            .extra = "\n[scheduler]\nname = \"cosine\"\ninterval = \"step\"\nt_max = 64\n\n[checkpoint]\n" + checkpoint + "\n"});
}

std::filesystem::path last_checkpoint(const TempDir& dir) { return dir / "run" / "checkpoints" / "last.ckpt"; }

std::string section(const std::filesystem::path& file, const std::string& name) {
  return std::string(CheckpointFile::read(file).section(name));
}

// A group's learning rate reaches only its parameters: fc1 at a rate too
// small to move a float32 stays exactly as initialized (as in a run where
// every rate is that small), while fc2 trains.
TEST(OptimizerGroups, AGroupsLearningRateReachesOnlyItsParameters) {
  TempDir grouped, frozen;
  const ProcessResult a =
      kiln_fit(groups_manifest(grouped, "name = \"sgd\"\nlr = 0.5\n\n[[optimizer.groups]]\nmatch = [\"fc1.*\"]\nlr = 1e-30"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("parameter group optimizer.groups[0]: 2 tensors"), std::string::npos) << a.output;
  ASSERT_EQ(kiln_fit(groups_manifest(frozen, "name = \"sgd\"\nlr = 1e-30")).exit_code, 0);
  const auto g = last_checkpoint(grouped), f = last_checkpoint(frozen);
  EXPECT_EQ(section(g, "param/fc1.weight"), section(f, "param/fc1.weight"));
  EXPECT_EQ(section(g, "param/fc1.bias"), section(f, "param/fc1.bias"));
  EXPECT_NE(section(g, "param/fc2.weight"), section(f, "param/fc2.weight"));
  EXPECT_NE(section(g, "param/fc2.bias"), section(f, "param/fc2.bias"));
}

// A C++ plugin's parameter registered without gradients stays frozen as an
// exported one does: AdamW with weight decay and clipping leave it bitwise
// as it was (a run of 1 epoch and of 3 end with the same bias), it is in
// the checkpoint and in `kiln export`, the summary counts it as
// non-trainable, and a group that names only it is refused in one line.
TEST(OptimizerGroups, ACppPluginsParameterWithoutGradientsStaysFrozen) {
  TempDir one, three, grouped;
  const std::string trainer = "batch_size = 4\ngradient_clip_val = 0.1\n";
  const std::string adamw = "\n[optimizer]\nname = \"adamw\"\nlr = 0.05\nweight_decay = 0.5\n";
  const ProcessResult a =
      kiln_fit(recorder_manifest(one, "frozen_bias = true", "size = 16", "", trainer + "max_epochs = 1\n" + adamw +
                                                                                "\n[checkpoint]\n"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("2         Non-trainable params"), std::string::npos) << a.output;
  const ProcessResult b =
      kiln_fit(recorder_manifest(three, "frozen_bias = true", "size = 16", "", trainer + "max_epochs = 3\n" + adamw +
                                                                                  "\n[checkpoint]\n"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto la = last_checkpoint(one), lb = last_checkpoint(three);
  EXPECT_EQ(section(la, "param/bias"), section(lb, "param/bias"));
  EXPECT_NE(section(la, "param/weight"), section(lb, "param/weight"));
  const ProcessResult exported = kiln({"export", lb.string(), "-o", (three / "w.safetensors").string()});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("exported 2 tensors"), std::string::npos) << exported.output;
  const ProcessResult refused = kiln_fit(recorder_manifest(
      grouped, "frozen_bias = true", "size = 16", "",
      trainer + "max_epochs = 1\n" + adamw + "\n[[optimizer.groups]]\nmatch = [\"bias\"]\nlr = 0.1\n"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("leaves the group no parameter to train"), std::string::npos) << refused.output;
}

// weight_decay = 0 on the biases: they end unlike a run that decays them.
TEST(OptimizerGroups, NoDecayOnBiasesChangesThemAndTheCheckpointNamesTheGroups) {
  TempDir grouped, plain;
  const std::string decayed = "name = \"adamw\"\nlr = 0.01\nweight_decay = 0.5";
  ASSERT_EQ(kiln_fit(groups_manifest(grouped, decayed + "\n\n[[optimizer.groups]]\nmatch = [\"*.bias\"]\nweight_decay = 0.0"))
                .exit_code,
            0);
  ASSERT_EQ(kiln_fit(groups_manifest(plain, decayed)).exit_code, 0);
  const auto g = last_checkpoint(grouped), p = last_checkpoint(plain);
  EXPECT_NE(section(g, "param/fc1.bias"), section(p, "param/fc1.bias"));
  EXPECT_NE(section(g, "param/fc2.bias"), section(p, "param/fc2.bias"));
  const std::string described = section(g, "optim/groups");
  EXPECT_NE(described.find("group optimizer\nparameters fc1.weight, fc2.weight\nlr 0.01\nweight_decay 0.5\n"),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("group optimizer.groups[0]\nmatch '*.bias'\nparameters fc1.bias, fc2.bias\nlr 0.01\n"
                           "weight_decay 0.0\n"),
            std::string::npos)
      << described;
}

// Interrupted mid-epoch and resumed, a run with groups (each on its own
// rate under a per-step cosine schedule) ends bitwise like an
// uninterrupted one; the same for each optimizer with several state fields.
struct OptimizerCase {
  const char* name;
  std::string optimizer;  // [optimizer] lines and its groups
};
// ctest shows the case's name, not its TOML.
void PrintTo(const OptimizerCase& c, std::ostream* out) { *out << c.name; }

class ResumeExactly : public testing::TestWithParam<OptimizerCase> {};

TEST_P(ResumeExactly, InterruptedAndResumedEqualsStraight) {
  TempDir straight, interrupted;
  ASSERT_EQ(kiln_fit(groups_manifest(straight, GetParam().optimizer)).exit_code, 0);
  const auto m = groups_manifest(interrupted, GetParam().optimizer, "every_n_epochs = 1\nevery_n_steps = 5");
  const ProcessResult first = kiln_fit(m, {"--set", "trainer.max_steps=45"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed = kiln_fit(m, {"--resume", "last"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("epoch 1, batch 13, step 45"), std::string::npos) << resumed.output;
  const auto a = last_checkpoint(straight), b = last_checkpoint(interrupted);
  ASSERT_FALSE(sections(a, "param/").empty());
  EXPECT_TRUE(sections(a, "param/") == sections(b, "param/")) << "parameters differ after resume";
  EXPECT_TRUE(sections(a, "optim/") == sections(b, "optim/")) << "optimizer state differs after resume";
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ResumeExactly,
    testing::Values(
        OptimizerCase{"adamw_with_groups",
                      "name = \"adamw\"\nlr = 0.01\nweight_decay = 0.1\n\n[[optimizer.groups]]\nmatch = [\"*.bias\"]\n"
                      "weight_decay = 0.0\n\n[[optimizer.groups]]\nmatch = [\"fc1.*\"]\nlr = 0.003\nbetas = [0.8, 0.99]"},
        OptimizerCase{"rmsprop_with_groups",
                      "name = \"rmsprop\"\nlr = 0.003\nmomentum = 0.5\ncentered = true\n\n[[optimizer.groups]]\n"
                      "match = [\"fc2.*\"]\nalpha = 0.9\ncentered = false"},
        OptimizerCase{"adagrad_with_groups",
                      "name = \"adagrad\"\nlr = 0.05\nlr_decay = 0.01\ninitial_accumulator_value = 0.1\n\n"
                      "[[optimizer.groups]]\nmatch = [\"*.bias\"]\ninitial_accumulator_value = 0.5"}),
    [](const testing::TestParamInfo<OptimizerCase>& info) { return std::string(info.param.name); });

// A resume whose groups differ from the checkpoint's is refused (exit 2,
// one line naming the key) before anything is written.
TEST(OptimizerGroups, ResumeWithDifferentGroupOptionsIsRefused) {
  TempDir dir;
  const std::string optimizer = "name = \"adamw\"\nlr = 0.01\n\n[[optimizer.groups]]\nmatch = [\"*.bias\"]\n"
                                "weight_decay = 0.0";
  const auto m = groups_manifest(dir, optimizer);
  ASSERT_EQ(kiln_fit(m, {"--set", "trainer.max_epochs=1"}).exit_code, 0);
  const std::string before = read_file(dir / "run" / "metrics.csv");
  const ProcessResult r = kiln_fit(m, {"--resume", "last", "--set", "optimizer.groups[0].weight_decay=0.1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("last.ckpt: the optimizer differs from the checkpointed run's: "
                          "optimizer.groups[0].weight_decay is 0.0 in the checkpoint but 0.1 in the manifest"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_file(dir / "run" / "metrics.csv"), before);
}

}  // namespace
}  // namespace kiln::test
