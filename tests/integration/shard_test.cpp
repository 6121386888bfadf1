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

#include <cinttypes>
#include <cstdio>
#include <set>
#include <sstream>
#include <tuple>

#include <ATen/ATen.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/rank_files.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common.hpp"

namespace kiln::test {
namespace {

// `bf16`: trainer.precision = "bf16-true", without [averaging] (which it refuses).
std::filesystem::path manifest(const TempDir& dir, const std::string& name, bool bf16 = false) {
  return write_run_manifest(
      dir, {.name = "shard",
            .run_dir = (dir / name).string(),
            .run = "seed = 7\nthreads = 1\n",
            .model = mlp_keys(20, "[13, 7]", 3),
            .data = synthetic_keys(20, 3, "train_size = 300\nval_size = 60\ntest_size = 0\n"),
            .trainer = trainer_keys(3, 10,
                                    std::string("data_workers = 0\naccumulate_grad_batches = 2\ngradient_clip_val = "
                                                "0.05\ngradient_clip_algorithm = \"value\"\n") +
                                        (bf16 ? "precision = \"bf16-true\"\n" : "")),
            .optimizer = "name = \"adamw\"\nlr = 0.01\nweight_decay = 0.01\n",
            .extra = std::string("\n[[optimizer.groups]]\nmatch = [\"*.bias\"]\nweight_decay = 0.0\n") +
                     (bf16 ? "" : "\n[averaging]\nkind = \"ema\"\n") + "\n[checkpoint]\n",
            .file = name + ".toml"});
}

// What a checkpoint's sections hold, as values: each tensor flattened
// (float32 to the bit), everything else its bytes.
struct State {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> texts;
};

void add_sections(State& state, const CheckpointFile& file, const std::string& prefix) {
  for (const auto& name : file.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    try {
      at::Tensor part = read_tensor_section(file, name).reshape({-1});
      // A sharded run's rank files hold each rank's run of a parameter, in
      // rank order: their concatenation is the whole tensor.
      auto [it, fresh] = state.tensors.emplace(name, part);
      if (!fresh) it->second = at::cat({it->second, part});
    } catch (const CheckpointError&) {
      state.texts.emplace(name, std::string(file.section(name)));
    }
  }
}

// The last checkpoint's model, optimizer and average sections; a sharded
// run's optimizer state from the rank files its checkpoint names, one per
// rank, which must all be there.
State trained_state(const std::filesystem::path& run) {
  const CheckpointFile file = CheckpointFile::read(run / "checkpoints" / "last.ckpt");
  State out;
  for (const char* prefix : {"param/", "buffer/", "optim/", "average/"}) add_sections(out, file, prefix);
  const std::vector<CheckpointFile> ranks = read_rank_files(file);
  for (const CheckpointFile& rank : ranks) add_sections(out, rank, "optim/");
  return out;
}

// How many rank files the run's last checkpoint names (0: rank 0 wrote it all).
size_t rank_files_of(const std::filesystem::path& run) {
  return read_rank_files(CheckpointFile::read(run / "checkpoints" / "last.ckpt")).size();
}

// Every section of the two the same, to the bit.
void expect_equal_sections(const State& want, const State& got) {
  ASSERT_FALSE(want.tensors.empty());
  EXPECT_EQ(want.tensors.size(), got.tensors.size());
  EXPECT_EQ(want.texts, got.texts);
  for (const auto& [name, tensor] : want.tensors) {
    const auto it = got.tensors.find(name);
    ASSERT_NE(it, got.tensors.end()) << name;
    EXPECT_TRUE(at::equal(it->second, tensor)) << name << " differs";
  }
}

void expect_same(const State& want, const State& got) {
  expect_equal_sections(want, got);
  for (const char* needed : {"optim/0/exp_avg", "optim/0/exp_avg_sq"}) EXPECT_EQ(want.tensors.count(needed), 1u) << needed;
  EXPECT_EQ(want.texts.count("average/count"), 1u);
}

std::vector<std::string> with_shard(std::vector<std::string> args, const std::string& mode) {
  args.insert(args.end(), {"--set", "distributed.shard=" + mode});
  return args;
}

// Every tensor of the two checkpoints within `tolerance` of each other:
// |a - b| <= tolerance * (1 + |a|); everything else the same.
void expect_close(const std::filesystem::path& want_run, const std::filesystem::path& got_run, double tolerance) {
  const State want = trained_state(want_run), got = trained_state(got_run);
  ASSERT_FALSE(want.tensors.empty());
  ASSERT_EQ(want.tensors.size(), got.tensors.size());
  EXPECT_EQ(want.texts, got.texts);
  for (const auto& [name, tensor] : want.tensors) {
    const at::Tensor a = tensor.to(at::kDouble), b = got.tensors.at(name).to(at::kDouble);
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
  // Each rank wrote its own share of the optimizer state beside rank 0's file.
  EXPECT_EQ(rank_files_of(dir / "replicated"), 0u);
  EXPECT_EQ(rank_files_of(dir / "sharded"), static_cast<size_t>(c.processes));
  // `kiln export` writes the full weights from either, the same bytes; `kiln inspect` names the rank files.
  auto exported = [&](const std::string& run) {
    const auto out = dir / (run + ".safetensors");
    const ProcessResult r = kiln({"export", (dir / run / "checkpoints" / "last.ckpt").string(), "-o", out.string()});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return read_file(out);
  };
  EXPECT_EQ(exported("replicated"), exported("sharded"));
  const ProcessResult inspect = kiln({"inspect", (dir / "sharded" / "checkpoints" / "last.ckpt").string()});
  EXPECT_NE(inspect.output.find("rank files:    " + std::to_string(c.processes) + " "), std::string::npos)
      << inspect.output;
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

// A run continued by runs of other world sizes, 2 -> 3 -> 1 -> 4 processes
// (each checkpoint taken inside an epoch, none splitting the parameters
// evenly at 3 or 4), each leg sharded or not, ends where the replicated
// chain ends, to the bit: each leg reshards what the last one wrote (rank
// files of 2 or 3 ranks read by 3, 1 or 4; the whole state of 1 process),
// the sharded chain committing asynchronously.
TEST(ShardedCheckpoints, ReshardAcrossWorldSizesAndBetweenModes) {
  TempDir dir;
  struct Leg {
    int processes;
    int max_steps;  // 0: to the end
  };
  const std::vector<Leg> legs{{2, 9}, {3, 14}, {1, 20}, {4, 0}};
  auto chain = [&](const std::string& name, const std::vector<std::string>& modes, bool async = false) {
    const auto m = manifest(dir, name);
    for (size_t i = 0; i < legs.size(); ++i) {
      std::vector<std::string> args{"-n", std::to_string(legs[i].processes), "--set",
                                    "trainer.accumulate_grad_batches=1", "--set",
                                    std::string("checkpoint.async=") + (async ? "true" : "false")};
      if (legs[i].max_steps) args.insert(args.end(), {"--set", "trainer.max_steps=" + std::to_string(legs[i].max_steps)});
      if (i > 0) args.insert(args.end(), {"--resume", "last"});
      const ProcessResult r = kiln_fit(m, with_shard(args, modes[i]));
      EXPECT_EQ(r.exit_code, 0) << name << " leg " << i << ": " << r.output;
    }
    return trained_state(dir / name);
  };
  const State want = chain("replicated", {"none", "none", "none", "none"});
  // Every rank writing its rank file in the background (checkpoint.async).
  expect_same(want, chain("sharded", {"optimizer", "optimizer", "optimizer", "gradients"}, /*async=*/true));
  expect_same(want, chain("mixed", {"gradients", "none", "optimizer", "none"}));
}

// kill -9 of any rank at any point of a sharded commit (a rank before its
// own file; rank 0 once every rank file is durable, before the checkpoint
// that names them) leaves the last committed checkpoint loadable: resumed,
// the run ends where an uninterrupted one ends, and the killed commit's
// rank files are removed, said in one line.
TEST(ShardedCheckpoints, AKillOfAnyRankMidCommitLeavesTheLastCheckpointWhole) {
  TempDir dir;
  const std::vector<std::string> two{"-n", "2", "--set", "distributed.shard=optimizer", "--set",
                                     "trainer.accumulate_grad_batches=1"};
  auto with = [](std::vector<std::string> args, std::initializer_list<std::string> more) {
    args.insert(args.end(), more);
    return args;
  };
  const ProcessResult whole = kiln_fit(manifest(dir, "whole"), with(two, {"--set", "trainer.max_epochs=2"}));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const ProcessResult first = kiln_fit(manifest(dir, "first"), with(two, {"--set", "trainer.max_epochs=1"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (const char* point : {"ckpt:rank1:before_rank_file", "ckpt:rank0:before_rank_file", "ckpt:before_index"}) {
    SCOPED_TRACE(point);
    const std::string name = std::string("killed_") + (point + 5);
    std::filesystem::copy(dir / "first", dir / name, std::filesystem::copy_options::recursive);
    const auto m = manifest(dir, name);
    const auto before = read_file(dir / name / "checkpoints" / "last.ckpt");
    const ProcessResult killed = kiln(with({"fit", m.string()}, {"-n", "2", "--set", "distributed.shard=optimizer",
                                                                "--set", "trainer.accumulate_grad_batches=1", "--set",
                                                                "trainer.max_epochs=2", "--resume", "last"}),
                                      {.env = {{"KILN_FAULT_INJECT", point}}});
    EXPECT_NE(killed.exit_code, 0) << killed.output;
    EXPECT_EQ(read_file(dir / name / "checkpoints" / "last.ckpt"), before);  // untouched
    const ProcessResult resumed = kiln_fit(m, with(two, {"--set", "trainer.max_epochs=2", "--resume", "last"}));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    if (std::string(point) != "ckpt:rank1:before_rank_file")  // rank 1 died before writing anything
      EXPECT_NE(resumed.output.find("rank file(s) in"), std::string::npos) << resumed.output;
    expect_same(trained_state(dir / "whole"), trained_state(dir / name));
    EXPECT_EQ(rank_files_of(dir / name), 2u);
    // What is left in shards/: the rank files the checkpoints name, 2 each, nothing else.
    std::set<std::string> named;
    for (const auto& entry : std::filesystem::directory_iterator(dir / name / "checkpoints"))
      if (entry.path().extension() == ".ckpt")
        named.insert(read_meta(read_checkpoint_head(entry.path())).rank_files.prefix);
    size_t left = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir / name / "checkpoints" / "shards")) {
      const std::string file = entry.path().filename().string();
      EXPECT_TRUE(named.count(file.substr(0, file.rfind(".rank")))) << file << " is named by no checkpoint";
      ++left;
    }
    EXPECT_EQ(left, 2 * named.size());
  }
  // A checkpoint whose rank file is gone is refused before anything runs:
  // exit 2, one line naming the file, the run directory as it was.
  std::filesystem::copy(dir / "first", dir / "lost", std::filesystem::copy_options::recursive);
  const auto lost = manifest(dir, "lost");
  for (const auto& entry : std::filesystem::directory_iterator(dir / "lost" / "checkpoints" / "shards"))
    if (entry.path().filename().string().find(".rank1-of-2") != std::string::npos) std::filesystem::remove(entry.path());
  const ProcessResult refused = kiln_fit(lost, with(two, {"--set", "trainer.max_epochs=2", "--resume", "last"}));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("rank 1's part"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("is missing"), std::string::npos) << refused.output;
  // Compressed gradients are the replicated all-reduce's: with a shard, refused at start.
  const ProcessResult compressed = kiln_fit(manifest(dir, "compressed"),
                                            with(two, {"--set", "distributed.gradient_compression=bf16"}));
  EXPECT_EQ(compressed.exit_code, 2) << compressed.output;
  EXPECT_NE(compressed.output.find("distributed.gradient_compression is for the replicated all-reduce"),
            std::string::npos)
      << compressed.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "compressed" / "checkpoints"));
}


// distributed.shard = "parameters" (ZeRO-3, optim/sharded_parameters.hpp):
// each rank keeps 1/N of every parameter and gathers a bucket whole while
// an operator reads it. With buckets of one parameter each (bucket_mb tiny),
// at most two stay whole, so forward frees what it gathered and backward
// gathers it again. The gathered weights are the replicated run's to the
// bit and the reduce-scatter is ZeRO-2's, so: without accumulation the
// replicated run's weights, optimizer state and metrics, at 2 and 3
// processes (395 values do not divide by 3); with accumulation ZeRO-2's
// (which keeps the replicated run's bits but for the accumulated sums'
// rounding, above). A run stopped at step 9 and continued by 3 processes
// in another mode, and the other way, ends where the replicated chain
// ends. Validation is not padded: 60 samples at batch size 10 are 3
// batches a rank at 2 processes, 2 and 2 and 2 at 3; at 4 (15 samples, 2
// batches each) and at 7 (9 or 8 samples: 1 batch each) every rank has as
// many, so the run at 7 processes takes 13 samples a rank...
// metrics.csv's columns but the timings, as text.
std::map<std::string, std::vector<std::string>> metric_columns(const std::filesystem::path& run) {
  std::istringstream in(read_file(run / "metrics.csv"));
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::string>> out;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
    if (names.empty()) {
      names = cells;
      continue;
    }
    for (size_t i = 0; i < cells.size() && i < names.size(); ++i)
      if (names[i].find("seconds") == std::string::npos && names[i].find("per_sec") == std::string::npos &&
          names[i].find("step_time") == std::string::npos)
        out[names[i]].push_back(cells[i]);
  }
  return out;
}

std::vector<std::string> zero3(std::vector<std::string> args) {
  args.insert(args.end(), {"--set", "averaging.kind=\"none\"", "--set", "distributed.bucket_mb=0.0001"});
  return args;
}

TEST(ShardedParameters, EachRankHoldsItsPartAndTheRunKeepsTheReplicatedRunsBits) {
  TempDir dir;
  auto fit = [&](const std::string& name, const std::vector<std::string>& args) {
    const ProcessResult r = kiln_fit(manifest(dir, name), zero3(args));
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    return r;
  };
  const std::vector<std::string> two{"-n", "2", "--set", "trainer.accumulate_grad_batches=1"};
  fit("replicated", two);
  const ProcessResult sharded = fit("parameters", with_shard(two, "parameters"));
  EXPECT_NE(sharded.output.find("distributed.shard = parameters: rank 0 holds the optimizer's state, the reduced "
                                "gradients and the parameters for 198 of the 395 trained values"),
            std::string::npos)
      << sharded.output;
  // One bucket a parameter (6), none kept whole past the next operator
  // that reads one: each step gathers the 6 in forward, and fc2's weight
  // again in backward (fc3's is still whole; fc1's input needs no
  // gradient). From the second pass of a kind on, each bucket's gather
  // asks for the next one the last pass read: at most a layer's weight and
  // bias (13*20 + 13 float32 values) and the next bucket (fc2's weight,
  // 7*13, at most) are whole at once (checkpoints, which gather all, aside).
  int64_t gathers = 0, ahead = 0, peak = 0, total = 0;
  double waited = 0;
  const size_t at = sharded.output.rfind("distributed.shard = parameters: ", sharded.output.find(" fetched ahead; "));
  ASSERT_NE(at, std::string::npos) << sharded.output;
  ASSERT_EQ(std::sscanf(sharded.output.c_str() + at,
                        "distributed.shard = parameters: %" SCNd64 " gathers, %" SCNd64
                        " of them fetched ahead; %lf s waited for gathers; at most %" SCNd64 " of the %" SCNd64,
                        &gathers, &ahead, &waited, &peak, &total),
            5)
      << sharded.output;
  EXPECT_EQ(total, 395 * 4);
  EXPECT_GT(peak, (13 * 20 + 13) * 4) << "a bucket on its way beside the layer computed";
  EXPECT_LE(peak, (13 * 20 + 13 + 7 * 13) * 4);
  EXPECT_GE(gathers, 45 * 7) << "45 steps, each gathering 6 weights, then fc2's again";
  // The first step and the first evaluation batch record; every later
  // pass fetches all but its first bucket ahead.
  EXPECT_GE(ahead, 44 * 5) << sharded.output;
  expect_equal_sections(trained_state(dir / "replicated"), trained_state(dir / "parameters"));
  EXPECT_EQ(metric_columns(dir / "replicated"), metric_columns(dir / "parameters"));
  // Over Gloo (as across hosts; NCCL's path): each rank's part padded to the chunk, all-gathered.
  std::vector<std::string> gloo = with_shard(two, "parameters");
  gloo.insert(gloo.end(), {"--set", "distributed.intra_host=gloo"});
  fit("parameters_gloo", gloo);
  expect_equal_sections(trained_state(dir / "replicated"), trained_state(dir / "parameters_gloo"));

  // Accumulation: ZeRO-2's bits, at 3 processes. 61 validation samples
  // are 21, 20 and 20 a rank, 3 batches on rank 0 and 2 on the others,
  // which repeat their last one, uncounted: the metrics are ZeRO-2's.
  const std::vector<std::string> three{"-n", "3", "--set", "trainer.accumulate_grad_batches=2", "--set",
                                       "data.val_size=61"};
  fit("zero2", with_shard(three, "gradients"));
  const ProcessResult uneven = fit("zero3", with_shard(three, "parameters"));
  expect_equal_sections(trained_state(dir / "zero2"), trained_state(dir / "zero3"));
  EXPECT_EQ(metric_columns(dir / "zero2"), metric_columns(dir / "zero3"));
  EXPECT_NE(uneven.output.find("sanity check: 2 val batches passed"), std::string::npos) << uneven.output;

  // Stopped at step 9 by 2 processes, continued by 3; sharded parameters
  // one way or the other, the replicated chain's bits.
  auto chain = [&](const std::string& name, const char* first, const char* second) {
    std::vector<std::string> stop = with_shard(two, first);
    stop.insert(stop.end(), {"--set", "trainer.max_steps=9"});
    std::vector<std::string> go_on = with_shard({"-n", "3", "--set", "trainer.accumulate_grad_batches=1"}, second);
    go_on.insert(go_on.end(), {"--resume", "last"});
    fit(name, stop);
    fit(name, go_on);
    return trained_state(dir / name);
  };
  const State want = chain("chain_replicated", "none", "none");
  expect_equal_sections(want, chain("chain_into_parameters", "gradients", "parameters"));
  expect_equal_sections(want, chain("chain_from_parameters", "parameters", "none"));

  // [averaging] keeps whole weights: refused at start, nothing written.
  const ProcessResult averaged =
      kiln_fit(manifest(dir, "averaged"), with_shard({"-n", "2"}, "parameters"));
  EXPECT_EQ(averaged.exit_code, 2) << averaged.output;
  EXPECT_NE(averaged.output.find("[averaging] keeps whole copies of the weights"), std::string::npos) << averaged.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "averaged" / "checkpoints"));
}

// trainer.precision = "bf16-true" (optim/master_weights.hpp) in every shard
// mode: the model's weights are bfloat16, the optimizer steps float32
// masters, which the checkpoint keeps ("optim/<i>/master"; each weight is
// its master rounded). The replicated buckets and the sharded
// reduce-scatter both sum float32 and round the mean once, so the modes
// keep each other's bits: ZeRO-1 with accumulation at 2 processes, ZeRO-2
// and ZeRO-3 at 3 (395 values do not divide by 3), each also stopped and resumed (in
// another mode, or the same) from its checkpoint's masters. A float32
// evaluation of a bf16-true checkpoint reads its weights as float32, and
// [averaging] with bf16-true is refused at start.
void expect_same_bf16(const State& want, const State& got, bool masters = true) {
  expect_equal_sections(want, got);
  // The optimizer's state in the dtype it steps: float32 masters', or the bfloat16 weights'.
  ASSERT_EQ(want.tensors.count("optim/0/exp_avg"), 1u);
  EXPECT_EQ(want.tensors.at("optim/0/exp_avg").scalar_type(), masters ? at::kFloat : at::kBFloat16);
  // 6 weights in bfloat16, each its float32 master rounded.
  int weights = 0, master_count = 0;
  for (const auto& [name, tensor] : want.tensors) {
    if (name.rfind("param/", 0) == 0) {
      ++weights;
      EXPECT_EQ(tensor.scalar_type(), at::kBFloat16) << name;
    }
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "/master") == 0) {
      ++master_count;
      EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
      bool rounded = false;
      for (const auto& [other, weight] : want.tensors)
        if (other.rfind("param/", 0) == 0 && weight.numel() == tensor.numel())
          rounded = rounded || at::equal(weight, tensor.to(at::kBFloat16));
      EXPECT_TRUE(rounded) << name << " rounded is none of the weights";
    }
  }
  EXPECT_EQ(weights, 6);
  EXPECT_EQ(master_count, masters ? 6 : 0);
}

TEST(Bf16True, EveryShardModeKeepsTheReplicatedRunsBitsAndReshards) {
  TempDir dir;
  auto fit = [&](const std::string& name, std::vector<std::string> args) {
    const ProcessResult r = kiln_fit(manifest(dir, name, /*bf16=*/true), args);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    return r;
  };
  const std::vector<std::string> accumulate{"-n", "2", "--set", "trainer.accumulate_grad_batches=2"};
  const ProcessResult replicated = fit("replicated", accumulate);
  EXPECT_NE(replicated.output.find("precision bf16-true"), std::string::npos) << replicated.output;
  const ProcessResult zero1 = fit("zero1", with_shard(accumulate, "optimizer"));
  EXPECT_NE(zero1.output.find("holds the optimizer's state and float32 master weights for 198 of the 395"),
            std::string::npos)
      << zero1.output;
  expect_same_bf16(trained_state(dir / "replicated"), trained_state(dir / "zero1"));

  // Stopped at step 9 and resumed in another mode, each way: the masters
  // come back from the checkpoint (a replicated one; rank files).
  auto resumed = [&](const std::string& name, std::vector<std::string> args, const char* first, const char* second) {
    std::vector<std::string> stop = with_shard(args, first), go_on = with_shard(args, second);
    stop.insert(stop.end(), {"--set", "trainer.max_steps=9"});
    go_on.insert(go_on.end(), {"--resume", "last"});
    fit(name, stop);
    fit(name, go_on);
    return trained_state(dir / name);
  };
  expect_same_bf16(trained_state(dir / "replicated"), resumed("zero1_then_replicated", accumulate, "optimizer", "none"));
  // ZeRO-2 at 3 processes (no accumulation: it reduces every micro-batch).
  const std::vector<std::string> three{"-n", "3", "--set", "trainer.accumulate_grad_batches=1"};
  fit("replicated3", three);
  expect_same_bf16(trained_state(dir / "replicated3"), resumed("zero2", three, "gradients", "gradients"));
  // ZeRO-3: the bfloat16 weights sharded too, gathered an operator at a time.
  std::vector<std::string> buckets = three;
  buckets.insert(buckets.end(), {"--set", "distributed.bucket_mb=0.0001"});
  expect_same_bf16(trained_state(dir / "replicated3"), resumed("zero3", buckets, "parameters", "parameters"));

  // Evaluated in float32: the bfloat16 weights read as float32, exactly.
  const ProcessResult validated =
      kiln({"validate", manifest(dir, "replicated3", /*bf16=*/true).string(), "--ckpt",
            (dir / "replicated3" / "checkpoints" / "last.ckpt").string(), "--set", "trainer.precision=\"32\""});
  EXPECT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_NE(validated.output.find("precision 32"), std::string::npos) << validated.output;

  const ProcessResult averaged = kiln_fit(manifest(dir, "averaged", /*bf16=*/true), {"--set", "averaging.kind=\"ema\""});
  EXPECT_EQ(averaged.exit_code, 2) << averaged.output;
  EXPECT_NE(averaged.output.find("averaging.kind = 'ema' is not built for trainer.precision = 'bf16-true'"),
            std::string::npos)
      << averaged.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "averaged"));
}

// trainer.master_weights = false: Lightning's bf16-true, the optimizer
// stepping the bfloat16 weights themselves, its state bfloat16 (no
// "/master" sections). The sharded reduce-scatter still sums float32 and
// rounds once into bfloat16 sums, so the modes keep the replicated run's
// bits as with masters: ZeRO-1 with accumulation at 2 processes, ZeRO-3 at
// 3, stopped and resumed. A run with masters goes on without them from
// its checkpoint, its moments rounded (and ends elsewhere than the run
// without: the option does something), and the other way, widened.
TEST(Bf16TrueWithoutMasters, TheOptimizerStepsTheBfloat16WeightsInEveryShardModeAndResumesAcross) {
  TempDir dir;
  auto fit = [&](const std::string& name, std::vector<std::string> args, bool masters = false) {
    if (!masters) args.insert(args.end(), {"--set", "trainer.master_weights=false"});
    const ProcessResult r = kiln_fit(manifest(dir, name, /*bf16=*/true), args);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    return r;
  };
  const std::vector<std::string> accumulate{"-n", "2", "--set", "trainer.accumulate_grad_batches=2"};
  const ProcessResult replicated = fit("replicated", accumulate);
  EXPECT_NE(replicated.output.find("precision bf16-true (no master weights"), std::string::npos) << replicated.output;
  const ProcessResult zero1 = fit("zero1", with_shard(accumulate, "optimizer"));
  EXPECT_NE(zero1.output.find("holds the optimizer's state for 198 of the 395"), std::string::npos) << zero1.output;
  expect_same_bf16(trained_state(dir / "replicated"), trained_state(dir / "zero1"), /*masters=*/false);

  const std::vector<std::string> three{"-n", "3", "--set", "trainer.accumulate_grad_batches=1", "--set",
                                       "distributed.bucket_mb=0.0001"};
  fit("replicated3", three);
  auto resumed = [&](const std::string& name, const char* mode, bool first_masters, bool then_masters) {
    std::vector<std::string> stop = with_shard(three, mode), go_on = with_shard(three, mode);
    stop.insert(stop.end(), {"--set", "trainer.max_steps=9"});
    go_on.insert(go_on.end(), {"--resume", "last"});
    fit(name, stop, first_masters);
    fit(name, go_on, then_masters);
    return trained_state(dir / name);
  };
  const State want = trained_state(dir / "replicated3");
  expect_same_bf16(want, resumed("zero3", "parameters", false, false), /*masters=*/false);
  // Across the setting, each way: the state the resumed run steps.
  const State dropped = resumed("masters_then_none", "parameters", true, false);
  // Its first 9 steps with masters end elsewhere than the run without.
  int differing = 0;
  for (const auto& [name, tensor] : want.tensors)
    if (name.rfind("param/", 0) == 0 && dropped.tensors.count(name))
      differing += at::equal(dropped.tensors.at(name), tensor) ? 0 : 1;
  EXPECT_GT(differing, 0) << "master_weights = false trained as the masters do";
  EXPECT_EQ(dropped.tensors.at("optim/0/exp_avg").scalar_type(), at::kBFloat16);
  EXPECT_EQ(dropped.tensors.count("optim/0/master"), 0u);
  const State taken = resumed("none_then_masters", "none", false, true);
  EXPECT_EQ(taken.tensors.at("optim/0/exp_avg").scalar_type(), at::kFloat);
  EXPECT_EQ(taken.tensors.count("optim/0/master"), 1u);
}

// A model whose ranks start apart (test.recorder_model's rank_offset: rank
// r adds r/4 to its initial weights, as a plugin seeding a generator of its
// own would): the start-up agreement makes rank 0's weights everyone's, so
// the run ends where the run whose ranks start equal ends, to the bit, in
// every shard mode. In bf16-true that includes the float32 masters, which
// are taken after the agreement: made from a rank's own weights, its first
// step wrote them back into its model. Sharded parameters take rank 0's a
// bucket at a time as they shard.
TEST(RanksStartingApart, TrainFromRankZerosWeightsInEveryModeAndPrecision) {
  auto fit = [&](const std::string& name, const std::string& precision, const char* mode, double offset) {
    TempDir own;
    const std::filesystem::path m = recorder_manifest(
        own, "features = 4\nrank_offset = " + std::to_string(offset), "size = 64\nfeatures = 4", "",
        "batch_size = 4\nmax_epochs = 2\ntest_after_fit = false\nprecision = \"" + precision +
            "\"\n[optimizer]\nname = \"adam\"\nlr = 0.05\n[distributed]\nshard = \"" + mode +
            "\"\nbucket_mb = 0.00001\n[checkpoint]\n");
    const ProcessResult r = kiln({"fit", m.string(), "-n", "2"});
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    return trained_state(own / "run");
  };
  for (const char* precision : {"32", "bf16-true"}) {
    const State equal = fit("equal", precision, "none", 0.0);
    const std::vector<const char*> modes =
        std::string(precision) == "32" ? std::vector<const char*>{"none", "parameters"}
                                       : std::vector<const char*>{"none", "optimizer", "gradients", "parameters"};
    for (const char* mode : modes) {
      SCOPED_TRACE(std::string(precision) + ", " + mode);
      const State apart = fit("apart", precision, mode, 0.25);
      for (const auto& [name, tensor] : equal.tensors)
        if (name.rfind("param/", 0) == 0) {
          ASSERT_EQ(apart.tensors.count(name), 1u) << name;
          EXPECT_TRUE(at::equal(apart.tensors.at(name), tensor)) << name << " differs from the run whose ranks start equal";
        }
    }
  }
}

}  // namespace
}  // namespace kiln::test
