// Asynchronous checkpoint commits (docs/checkpoints.md): the file written in
// the background is the snapshot taken at the boundary, and a write that
// fails in the background ends every rank with its cause while the earlier
// checkpoints stay as they were. SIGKILL at each point of a background write:
// checkpoint_test's EveryPoint/FaultPoint.*_async.
#include <gtest/gtest.h>

#include <set>

#include "checkpoint_sections.hpp"
#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

std::filesystem::path ckpt_dir(const TempDir& dir) { return dir / "run" / "checkpoints"; }

std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Dropout, Adam and a checkpoint every 3 steps: any change the next steps
// made to a snapshot still being written would show in its bytes.
std::filesystem::path every_three_steps(const TempDir& dir) {
  return synthetic_manifest(dir,
                            "\n[checkpoint]\nevery_n_steps = 3\nevery_n_epochs = 0\nsave_top_k = -1\nasync = true\n");
}

TEST(AsyncCheckpoint, EachFileHoldsTheSameStateAsTheSynchronousRunsFile) {
  TempDir sync_dir, async_dir;
  const auto sync_run = kiln_fit(every_three_steps(sync_dir), {"--set", "checkpoint.async=false", "--set",
                                                              "trainer.max_steps=40", "--set", "model.dropout=0.2"});
  ASSERT_EQ(sync_run.exit_code, 0) << sync_run.output;
  const auto async_run = kiln_fit(every_three_steps(async_dir), {"--set", "checkpoint.async=true", "--set",
                                                                "trainer.max_steps=40", "--set", "model.dropout=0.2"});
  ASSERT_EQ(async_run.exit_code, 0) << async_run.output;
  const auto names = names_in(ckpt_dir(sync_dir));
  ASSERT_EQ(names, names_in(ckpt_dir(async_dir)));
  EXPECT_EQ(names.size(), 13u + 1u + 1u) << "steps 3, 6, ..., 39, the fit's end at 40 and last.ckpt";
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto expected = state_sections(ckpt_dir(sync_dir) / name);
    const auto written = state_sections(ckpt_dir(async_dir) / name);
    std::string differ;
    for (const auto& [section, bytes] : expected)
      if (auto it = written.find(section); it == written.end() || it->second != bytes) differ += " " + section;
    EXPECT_EQ(expected.size(), written.size());
    EXPECT_EQ(differ, "") << "the asynchronous commit wrote other bytes than the state at its boundary";
  }
  // "committed" is said once per file, each after it is durable; the last
  // before fit ends.
  size_t committed = 0;
  for (size_t at = 0; (at = async_run.output.find("checkpoint committed:", at)) != std::string::npos; ++at)
    ++committed;
  EXPECT_EQ(committed, 14u) << async_run.output;
  EXPECT_LT(async_run.output.rfind("checkpoint committed:"), async_run.output.find("fit done"));
}

// A full disk under the background write of step 6's checkpoint, with one
// and with two processes: the run ends with that cause, named once on
// rank 0 and as the run's cause; step 3's checkpoint is intact and last.ckpt
// still points at it; nothing later was written and no temporary is left.
TEST(AsyncCheckpoint, AFailedBackgroundWriteEndsEveryRankWithItsCauseAndKeepsTheEarlierCheckpoints) {
  for (const int n : {1, 2}) {
    SCOPED_TRACE("processes " + std::to_string(n));
    TempDir dir;
    std::vector<std::string> args{"fit", every_three_steps(dir).string(), "--set", "trainer.max_steps=60"};
    for (const auto& a : processes(n)) args.push_back(a);
    const ProcessResult r =
        kiln(args, {.env = {{"KILN_FAULT_INJECT", "ckpt:enospc@epoch=0000-step=000000006.ckpt"}}});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string cause = "checkpoint not committed: cannot write checkpoint " +
                              (ckpt_dir(dir) / "epoch=0000-step=000000006.ckpt").string() + ": write ";
    EXPECT_NE(r.output.find(cause), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("Traceback"), std::string::npos);
    EXPECT_EQ(names_in(ckpt_dir(dir)), (std::set<std::string>{"epoch=0000-step=000000003.ckpt", "last.ckpt"}));
    EXPECT_FALSE(CheckpointFile::check(ckpt_dir(dir) / "last.ckpt").has_value());
    EXPECT_EQ(read_meta(CheckpointFile::read(ckpt_dir(dir) / "last.ckpt")).position.global_step, 3);
    // Resume from what survived works.
    const auto resumed = kiln_fit(dir / "run.toml", {"--resume", "last", "--set", "trainer.max_steps=9"});
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  }
}

TEST(AsyncCheckpoint, PreemptionWaitsForTheWriteInFlightBeforeItSaysCommitted) {
  TempDir dir;
  const auto m = synthetic_manifest(dir, "\n[checkpoint]\nevery_n_steps = 1\nevery_n_epochs = 0\nasync = true\n");
  const std::string command = "\"" + kiln_exe().string() + "\" fit \"" + m.string() +
                              "\" --set trainer.max_epochs=100000 & pid=$!; n=0; while [ ! -e \"" +
                              (ckpt_dir(dir) / "last.ckpt").string() + "\" ] && [ $n -lt 2400 ]; do sleep 0.05; "
                              "n=$((n+1)); done; kill -TERM $pid; wait $pid";
  const ProcessResult r = run_process({"/bin/sh", "-c", command}, {.timeout = std::chrono::seconds(300)});
  EXPECT_EQ(r.exit_code, 75) << r.output;
  const std::string said = "preempted by SIGTERM; checkpoint committed: ";
  const size_t at = r.output.find(said);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string file = r.output.substr(at + said.size(), r.output.find(' ', at + said.size()) - at - said.size());
  EXPECT_FALSE(CheckpointFile::check(file).has_value()) << file;
  EXPECT_TRUE(std::filesystem::equivalent(ckpt_dir(dir) / "last.ckpt", file)) << "last.ckpt is not the file named";
}

}  // namespace
}  // namespace kiln::test
