// The bad-input catalogue: malformed manifests, --set values, command
// lines, checkpoints, plugin files and data files. Each is given to the real
// `kiln` and must give exactly one line that names the input, exit 2, no C++
// backtrace, and leave every file under the case's directory as it was
// (nothing created, nothing changed).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(120);
const std::filesystem::path kFashionMnist = fashion_mnist_root();

std::string bytes_of(const std::filesystem::path& file) { return read_file(file); }
void put_bytes(const std::filesystem::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

uint64_t get_u64(const std::string& b, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
void set_u64(std::string& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); }

// The checkpoint layout (ckpt/checkpoint_format.hpp): 12-byte header, then
// sections "u32 name length, name, u64 data length, data". Offset of the
// first section's u64 data length.
size_t first_section_length_at(const std::string& b) {
  uint32_t name_length = 0;
  std::memcpy(&name_length, b.data() + 12, 4);
  return 12 + 4 + name_length;
}

// Re-seals a checkpoint whose bytes were edited: the XXH64 before its last
// 16 bytes ("u64 checksum, KILNEND\0"), so only the edit is wrong.
void reseal(std::string& b) {
  const size_t at = b.size() - 16;
  set_u64(b, at, XXH64(b.data(), at, 0));
}

// One case's directory: a valid manifest (run.toml) on the synthetic data
// with checkpoints in ckpt/, a checkpoint of this model in ckpt/good.ckpt,
// and what the earlier run left in run/.
struct Case {
  TempDir dir{"kiln-bad-input"};
  std::filesystem::path manifest, good;
  std::vector<std::string> args;  // the kiln command line
  std::string names;              // what the error line must name
};

std::string g_checkpoint;  // a real checkpoint of the synthetic MLP, made once
std::string g_other_model_checkpoint;

std::string manifest_text(const TempDir& dir, const std::string& extra = "") {
  return "[run]\nname = \"bad-input\"\ndir = \"" + (dir / "run").string() +
         "\"\nseed = 3\nthreads = 1\n\n[model]\npath = \"kiln_mlp\"\nin_features = 32\nhidden = [16]\nclasses = 4\n\n"
         "[data]\npath = \"kiln_synthetic\"\nfeatures = 32\nclasses = 4\n\n[trainer]\nmax_epochs = 1\nbatch_size = 32\n"
         "progress = \"none\"\n\n[optimizer]\nname = \"adam\"\nlr = 0.01\n\n[checkpoint]\ndir = \"" +
         (dir / "ckpt").string() + "\"\n" + extra;
}

void prepare(Case& c) {
  c.manifest = c.dir / "run.toml";
  write_file(c.manifest, manifest_text(c.dir));
  std::filesystem::create_directories(c.dir / "ckpt");
  std::filesystem::create_directories(c.dir / "run");
  write_file(c.dir / "run" / "metrics.csv", "epoch,step,train/loss\n0,10,0.5\n");
  c.good = c.dir / "ckpt" / "good.ckpt";
  put_bytes(c.good, g_checkpoint);
}

struct BadInput {
  const char* name;
  std::function<void(Case&)> make;  // damages the case and sets args and names
};

std::vector<std::string> fit(const Case& c, std::vector<std::string> more = {}) {
  std::vector<std::string> args{"fit", c.manifest.string()};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

void rewrite_manifest(Case& c, const std::string& from, const std::string& to) {
  std::string text = read_file(c.manifest);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  write_file(c.manifest, text);
}

// A damaged copy of good.ckpt given to --resume.
void resume_damaged(Case& c, const std::function<void(std::string&)>& damage) {
  std::string bytes = g_checkpoint;
  damage(bytes);
  put_bytes(c.dir / "ckpt" / "damaged.ckpt", bytes);
  c.args = fit(c, {"--resume", (c.dir / "ckpt" / "damaged.ckpt").string()});
  c.names = "damaged.ckpt";
}

// A copy of the Fashion-MNIST files with one of them damaged.
void fashion_mnist_damaged(Case& c, const std::string& file, const std::function<void(std::string&)>& damage) {
  const auto root = c.dir / "fmnist";
  std::filesystem::create_directories(root);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"})
    std::filesystem::copy_file(kFashionMnist / f, root / f);
  std::string bytes = bytes_of(root / file);
  damage(bytes);
  put_bytes(root / file, bytes);
  rewrite_manifest(c, "[data]\npath = \"kiln_synthetic\"\nfeatures = 32\nclasses = 4\n",
                   "[data]\npath = \"kiln_fashion_mnist\"\nroot = \"" + root.string() + "\"\n");
  rewrite_manifest(c, "in_features = 32", "in_features = 784");
  rewrite_manifest(c, "classes = 4\n\n[data]", "classes = 10\n\n[data]");
  c.args = fit(c);
  c.names = file;
}

// The model plugin's first `length` bytes, as [model]'s path.
void truncated_plugin(Case& c, size_t length) {
  const std::string bytes = bytes_of(plugin_dir() / "libkiln_mlp.so");
  ASSERT_GT(bytes.size(), length);
  put_bytes(c.dir / "libkiln_mlp_cut.so", bytes.substr(0, length));
  rewrite_manifest(c, "path = \"kiln_mlp\"", "path = \"" + (c.dir / "libkiln_mlp_cut.so").string() + "\"");
  c.names = "libkiln_mlp_cut.so";
}

// The charlm model on a token file written into the case's directory.
void token_stream_case(Case& c, const std::string& file, const std::string& data_keys) {
  rewrite_manifest(c, "[model]\npath = \"kiln_mlp\"\nin_features = 32\nhidden = [16]\nclasses = 4\n",
                   "[model]\npath = \"kiln_charlm\"\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n");
  rewrite_manifest(c, "[data]\npath = \"kiln_synthetic\"\nfeatures = 32\nclasses = 4\n",
                   "[data]\npath = \"kiln_token_stream\"\nfile = \"" + (c.dir / file).string() + "\"\n" + data_keys);
  c.args = fit(c);
}

std::vector<BadInput> catalogue() {
  return {
      // --- manifests ----------------------------------------------------------
      {"manifest_toml_syntax_error", [](Case& c) { write_file(c.manifest, "[run\nname = \"x\"\n"); c.args = fit(c); c.names = "run.toml:1"; }},
      {"manifest_unknown_host_key", [](Case& c) { rewrite_manifest(c, "max_epochs = 1", "max_epoch = 1"); c.args = fit(c); c.names = "max_epoch"; }},
      {"manifest_wrong_type", [](Case& c) { rewrite_manifest(c, "max_epochs = 1", "max_epochs = \"three\""); c.args = fit(c); c.names = "max_epochs"; }},
      {"manifest_out_of_range", [](Case& c) { rewrite_manifest(c, "batch_size = 32", "batch_size = 0"); c.args = fit(c); c.names = "batch_size"; }},
      {"manifest_unknown_plugin", [](Case& c) { rewrite_manifest(c, "path = \"kiln_mlp\"", "path = \"kiln_nope\""); c.args = fit(c); c.names = "kiln_nope"; }},
      {"manifest_missing_model_table", [](Case& c) { rewrite_manifest(c, "[model]\npath = \"kiln_mlp\"\nin_features = 32\nhidden = [16]\nclasses = 4\n", ""); c.args = fit(c); c.names = "[model]"; }},
      {"manifest_duplicate_plugin_id", [](Case& c) { write_file(c.manifest, read_file(c.manifest) + "[[callbacks]]\npath = \"kiln_early_stopping\"\n[[callbacks]]\npath = \"kiln_early_stopping\"\n"); c.args = fit(c); c.names = "kiln.early_stopping"; }},
      {"manifest_unknown_plugin_key", [](Case& c) { rewrite_manifest(c, "hidden = [16]", "hiden = [16]"); c.args = fit(c); c.names = "hiden"; }},
      {"manifest_unknown_optimizer", [](Case& c) { rewrite_manifest(c, "name = \"adam\"", "name = \"adamw2\""); c.args = fit(c); c.names = "adamw2"; }},
      {"manifest_fused_optimizer_not_adam", [](Case& c) { rewrite_manifest(c, "name = \"adam\"", "name = \"sgd\"\nfused = true"); c.args = fit(c); c.names = "optimizer.fused = true is for adam and adamw"; }},
      {"distributed_shard_with_compressed_gradients", [](Case& c) { write_file(c.manifest, read_file(c.manifest) + "[distributed]\nshard = \"gradients\"\ngradient_compression = \"bf16\"\n"); c.args = fit(c); c.names = "distributed.gradient_compression is for the replicated all-reduce"; }},
      {"manifest_unknown_scheduler", [](Case& c) { write_file(c.manifest, read_file(c.manifest) + "[scheduler]\nname = \"cosinus\"\n"); c.args = fit(c); c.names = "cosinus"; }},
      {"manifest_empty_file", [](Case& c) { write_file(c.manifest, ""); c.args = fit(c); c.names = "run.toml"; }},
      {"manifest_unknown_logger", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[logging]\nloggers = [\"csv\", \"tensorbord\"]\n");
         c.args = fit(c);
         c.names = "logging.loggers[1] must be 'csv', 'jsonl', 'tensorboard' or 'mlflow', not 'tensorbord' (did you mean 'tensorboard'?)";
       }},
      {"mlflow_tracking_uri_with_a_password", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[logging]\nloggers = [\"mlflow\"]\n[logging.mlflow]\n"
                                                        "tracking_uri = \"http://alice:hunter2@127.0.0.1:5000\"\n");
         c.args = fit(c);
         c.names = "logging.mlflow.tracking_uri must not hold a user name or password";
       }},
      {"mlflow_unknown_key", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[logging]\nloggers = [\"mlflow\"]\n[logging.mlflow]\n"
                                                        "trackin_uri = \"http://127.0.0.1:5000\"\n");
         c.args = fit(c);
         c.names = "unknown key 'trackin_uri' in [logging.mlflow] (did you mean 'tracking_uri'?)";
       }},
      {"mlflow_without_a_server", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[logging]\nloggers = [\"mlflow\"]\n");
         c.args = fit(c);
         c.names = "logging.loggers names \"mlflow\" but no server: set logging.mlflow.tracking_uri";
       }},
      {"manifest_loggers_not_an_array", [](Case& c) { write_file(c.manifest, read_file(c.manifest) + "[logging]\nloggers = \"jsonl\"\n"); c.args = fit(c); c.names = "logging.loggers must be an array"; }},
      {"manifest_plugin_key_wrong_type", [](Case& c) { rewrite_manifest(c, "hidden = [16]", "hidden = \"sixteen\""); c.args = fit(c); c.names = "hidden"; }},
      {"manifest_optimizer_group_matches_no_parameter", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[[optimizer.groups]]\nmatch = [\"*.bais\"]\nweight_decay = 0.0\n");
         c.args = fit(c);
         c.names = "optimizer.groups[0].match: '*.bais' matches no parameter of model 'kiln.mlp' (its parameters: fc1.weight, fc1.bias";
       }},
      {"manifest_optimizer_group_unknown_key", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[[optimizer.groups]]\nmatch = [\"*.bias\"]\nweight_decy = 0.0\n");
         c.args = fit(c);
         c.names = "unknown key 'weight_decy' in optimizer.groups[0]";
       }},
      {"manifest_optimizer_group_option_the_optimizer_ignores", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[[optimizer.groups]]\nmatch = [\"*.bias\"]\nmomentum = 0.9\n");
         c.args = fit(c);
         c.names = "optimizer.groups[0].momentum: adam takes no momentum";
       }},
      // --- --set ----------------------------------------------------------------
      {"set_without_equals", [](Case& c) { c.args = fit(c, {"--set", "trainer.max_epochs"}); c.names = "trainer.max_epochs"; }},
      {"set_unknown_key", [](Case& c) { c.args = fit(c, {"--set", "trainer.nope=1"}); c.names = "nope"; }},
      {"set_wrong_type", [](Case& c) { c.args = fit(c, {"--set", "trainer.max_epochs=abc"}); c.names = "max_epochs"; }},
      {"set_bad_array_index", [](Case& c) { c.args = fit(c, {"--set", "callbacks[x].patience=1"}); c.names = "callbacks[x]"; }},
      {"set_unknown_logger", [](Case& c) { c.args = fit(c, {"--set", "logging.loggers=[\"wandb\"]"}); c.names = "logging.loggers[0] must be 'csv', 'jsonl', 'tensorboard' or 'mlflow', not 'wandb'"; }},
      {"set_unparsable_number", [](Case& c) { c.args = fit(c, {"--set", "optimizer.lr=1e"}); c.names = "lr"; }},
      // --- devices and precision (refused on any machine: with or without a GPU) --
      {"device_index_past_the_gpus", [](Case& c) { c.args = fit(c, {"--set", "run.device=cuda:4095"}); c.names = "run.device = 'cuda:4095'"; }},
      {"device_one_gpu_for_two_ranks", [](Case& c) { c.args = fit(c, {"-n", "2", "--set", "run.device=cuda:0"}); c.names = "run.device = 'cuda:0'"; }},
      {"precision_16_mixed_on_the_cpu", [](Case& c) { c.args = fit(c, {"--set", "run.device=cpu", "--set", "trainer.precision=16-mixed"}); c.names = "trainer.precision = '16-mixed'"; }},
      // --- gradients between ranks -------------------------------------------------
      {"intra_host_unknown", [](Case& c) { c.args = fit(c, {"-n", "2", "--set", "distributed.intra_host=nvlink"}); c.names = "distributed.intra_host must be 'auto', 'shm' or 'gloo', not 'nvlink'"; }},
      {"gradient_compression_unknown", [](Case& c) { c.args = fit(c, {"-n", "2", "--set", "distributed.gradient_compression=int8"}); c.names = "distributed.gradient_compression must be 'none', 'bf16' or 'fp16', not 'int8'"; }},
      // --- time and validation cadence --------------------------------------------
      {"max_time_that_does_not_parse", [](Case& c) { c.args = fit(c, {"--set", "trainer.max_time=2h"}); c.names = "trainer.max_time"; }},
      {"val_check_interval_zero", [](Case& c) { c.args = fit(c, {"--set", "trainer.val_check_interval=0"}); c.names = "trainer.val_check_interval"; }},
      // --- around the loop (issue 23) ---------------------------------------------
      {"num_sanity_val_steps_below_minus_one", [](Case& c) { c.args = fit(c, {"--set", "trainer.num_sanity_val_steps=-2"}); c.names = "trainer.num_sanity_val_steps must be >= -1"; }},
      {"overfit_batches_with_limit_train_batches", [](Case& c) { c.args = fit(c, {"--set", "trainer.overfit_batches=2", "--set", "trainer.limit_train_batches=5"}); c.names = "trainer.limit_train_batches cannot be set with trainer.overfit_batches"; }},
      {"overfit_batches_with_shuffle", [](Case& c) { c.args = fit(c, {"--set", "trainer.overfit_batches=2", "--set", "trainer.shuffle=true"}); c.names = "trainer.shuffle = true cannot be set with trainer.overfit_batches"; }},
      {"detect_nonfinite_unknown", [](Case& c) { c.args = fit(c, {"--set", "trainer.detect_nonfinite=loud"}); c.names = "trainer.detect_nonfinite must be 'off', 'warn' or 'raise', not 'loud'"; }},
      {"ema_decay_one", [](Case& c) { c.args = fit(c, {"--set", "averaging.kind=ema", "--set", "averaging.decay=1.0"}); c.names = "averaging.decay must be in (0.0, 1.0)"; }},
      {"ema_decay_zero", [](Case& c) { c.args = fit(c, {"--set", "averaging.kind=ema", "--set", "averaging.decay=0.0"}); c.names = "averaging.decay must be in (0.0, 1.0)"; }},
      {"swa_starting_after_the_last_epoch", [](Case& c) { c.args = fit(c, {"--set", "averaging.kind=swa", "--set", "averaging.start_epoch=5"}); c.names = "SWA would start at epoch 5"; }},
      {"swa_fraction_of_unbounded_epochs", [](Case& c) { c.args = fit(c, {"--set", "averaging.kind=swa", "--set", "trainer.max_epochs=-1", "--set", "trainer.max_steps=10"}); c.names = "averaging.start_epoch = 0.8 is a fraction of trainer.max_epochs"; }},
      {"swa_lr_with_a_per_step_schedule", [](Case& c) { c.args = fit(c, {"--set", "averaging.kind=swa", "--set", "averaging.swa_lr=0.01", "--set", "scheduler.interval=step"}); c.names = "averaging.swa_lr replaces the learning-rate schedule"; }},
      {"swa_key_with_ema", [](Case& c) { c.args = fit(c, {"--set", "averaging.kind=ema", "--set", "averaging.swa_lr=0.01"}); c.names = "averaging.swa_lr is not read with averaging.kind = 'ema'"; }},
      {"averaging_key_without_a_kind", [](Case& c) { c.args = fit(c, {"--set", "averaging.decay=0.99"}); c.names = "averaging.decay is set but averaging.kind is not"; }},
      {"profiler_unknown_kind", [](Case& c) { c.args = fit(c, {"--set", "profiler.kind=pytorch"}); c.names = "profiler.kind must be 'none', 'simple' or 'trace', not 'pytorch'"; }},
      // --- command lines --------------------------------------------------------
      {"cli_unknown_flag", [](Case& c) { c.args = fit(c, {"--frobnicate"}); c.names = "--frobnicate"; }},
      {"cli_zero_processes", [](Case& c) { c.args = fit(c, {"-n", "0"}); c.names = "--processes"; }},
      {"cli_missing_manifest", [](Case& c) { c.args = {"fit", (c.dir / "nope.toml").string()}; c.names = "nope.toml"; }},
      {"cli_unknown_command", [](Case& c) { c.args = {"frobnicate", c.manifest.string()}; c.names = "frobnicate"; }},
      {"cli_resume_missing_file", [](Case& c) { c.args = fit(c, {"--resume", (c.dir / "ckpt" / "nope.ckpt").string()}); c.names = "--resume: " + (c.dir / "ckpt" / "nope.ckpt").string(); }},
      // Each command's checkpoint flag given to the other: what was meant.
      {"cli_resume_given_to_validate", [](Case& c) { c.args = {"validate", c.manifest.string(), "--resume", "last"}; c.names = "kiln validate takes the checkpoint to evaluate as --ckpt"; }},
      {"cli_ckpt_path_given_to_fit", [](Case& c) { c.args = fit(c, {"--ckpt_path", "last"}); c.names = "kiln fit continues from a checkpoint with --resume"; }},
      // An evaluation's checkpoint is named by the flag the user gave it.
      {"cli_ckpt_missing_file", [](Case& c) { c.args = {"validate", c.manifest.string(), "--ckpt", (c.dir / "ckpt" / "nope.ckpt").string()}; c.names = "--ckpt: " + (c.dir / "ckpt" / "nope.ckpt").string(); }},
      {"cli_resume_best_without_monitor_checkpoints", [](Case& c) { std::filesystem::remove(c.good); c.args = fit(c, {"--resume", "best"}); c.names = "best"; }},
      // --- checkpoints ----------------------------------------------------------
      {"ckpt_empty", [](Case& c) { resume_damaged(c, [](std::string& b) { b.clear(); }); }},
      {"ckpt_truncated_in_header", [](Case& c) { resume_damaged(c, [](std::string& b) { b.resize(10); }); }},
      {"ckpt_truncated_in_half", [](Case& c) { resume_damaged(c, [](std::string& b) { b.resize(b.size() / 2); }); }},
      {"ckpt_truncated_before_trailer", [](Case& c) { resume_damaged(c, [](std::string& b) { b.resize(b.size() - 9); }); }},
      {"ckpt_bit_flip_in_payload", [](Case& c) { resume_damaged(c, [](std::string& b) { b[b.size() / 2] ^= 0x10; }); }},
      {"ckpt_bit_flip_in_magic", [](Case& c) { resume_damaged(c, [](std::string& b) { b[0] ^= 0x01; }); }},
      {"ckpt_future_format_version", [](Case& c) { resume_damaged(c, [](std::string& b) { b[8] = 99; reseal(b); }); }},
      {"ckpt_wrong_section_size", [](Case& c) {
         resume_damaged(c, [](std::string& b) { const size_t at = first_section_length_at(b); set_u64(b, at, get_u64(b, at) + 3); reseal(b); });
       }},
      {"ckpt_huge_declared_length", [](Case& c) {
         resume_damaged(c, [](std::string& b) { set_u64(b, first_section_length_at(b), uint64_t{1} << 62); reseal(b); });
       }},
      {"ckpt_of_another_model", [](Case& c) {
         put_bytes(c.dir / "ckpt" / "other.ckpt", g_other_model_checkpoint);
         c.args = fit(c, {"--resume", (c.dir / "ckpt" / "other.ckpt").string()});
         c.names = "other.ckpt";
       }},
      {"ckpt_resumed_with_other_optimizer_groups", [](Case& c) {
         write_file(c.manifest, read_file(c.manifest) + "[[optimizer.groups]]\nmatch = [\"*.bias\"]\nweight_decay = 0.0\n");
         c.args = fit(c, {"--resume", c.good.string()});
         c.names = "good.ckpt: the optimizer differs from the checkpointed run's: the manifest has optimizer.groups[0] (match '*.bias') but the checkpoint has no such group";
       }},
      {"export_missing_checkpoint", [](Case& c) { c.args = {"export", (c.dir / "ckpt" / "nope.ckpt").string()}; c.names = "nope.ckpt"; }},
      {"export_truncated_checkpoint", [](Case& c) {
         std::string b = g_checkpoint;
         b.resize(b.size() / 2);
         put_bytes(c.dir / "ckpt" / "cut.ckpt", b);
         c.args = {"export", (c.dir / "ckpt" / "cut.ckpt").string()};
         c.names = "cut.ckpt";
       }},
      {"export_unknown_format", [](Case& c) { c.args = {"export", c.good.string(), "--format", "onnx"}; c.names = "--format: must be 'safetensors' or 'pt', not 'onnx'"; }},
      {"export_output_exists", [](Case& c) {
         write_file(c.dir / "ckpt" / "good.safetensors", "an earlier export");
         c.args = {"export", c.good.string()};
         c.names = "good.safetensors exists";
       }},
      {"export_output_directory_missing", [](Case& c) {
         c.args = {"export", c.good.string(), "-o", (c.dir / "nowhere" / "w.pt").string(), "--format", "pt"};
         c.names = "nowhere";
       }},
      {"inspect_truncated_checkpoint", [](Case& c) {
         std::string b = g_checkpoint;
         b.resize(b.size() - 30);
         put_bytes(c.dir / "ckpt" / "cut.ckpt", b);
         c.args = {"inspect", (c.dir / "ckpt" / "cut.ckpt").string()};
         c.names = "cut.ckpt";
       }},
      {"inspect_bit_flipped_checkpoint", [](Case& c) {
         std::string b = g_checkpoint;
         b[40] ^= 0x80;
         put_bytes(c.dir / "ckpt" / "flip.ckpt", b);
         c.args = {"inspect", (c.dir / "ckpt" / "flip.ckpt").string()};
         c.names = "flip.ckpt";
       }},
      // --- plugin files ----------------------------------------------------------
      {"plugin_not_an_elf_file", [](Case& c) {
         write_file(c.dir / "libtext.so", "this is not a shared object\n");
         rewrite_manifest(c, "path = \"kiln_mlp\"", "path = \"" + (c.dir / "libtext.so").string() + "\"");
         c.args = fit(c);
         c.names = "libtext.so";
       }},
      {"plugin_empty_file", [](Case& c) {
         write_file(c.dir / "libempty.so", "");
         rewrite_manifest(c, "path = \"kiln_mlp\"", "path = \"" + (c.dir / "libempty.so").string() + "\"");
         c.args = fit(c);
         c.names = "libempty.so";
       }},
      // A plugin cut short by an interrupted copy: dlopen would map pages past
      // the end of the file (SIGBUS); the loader reads the ELF headers first.
      {"plugin_truncated_to_4_kib", [](Case& c) { truncated_plugin(c, 4096); c.args = fit(c); }},
      {"plugin_truncated_to_64_kib", [](Case& c) { truncated_plugin(c, 65536); c.args = fit(c); }},
      {"inspect_manifest_with_a_plugin_truncated_to_4_kib", [](Case& c) {
         truncated_plugin(c, 4096);
         c.args = {"inspect", c.manifest.string()};
       }},
      {"inspect_plugin_truncated_to_64_kib", [](Case& c) {
         truncated_plugin(c, 65536);
         c.args = {"inspect", (c.dir / "libkiln_mlp_cut.so").string()};
       }},
      {"inspect_a_directory", [](Case& c) { c.args = {"inspect", (c.dir / "ckpt").string()}; c.names = "ckpt is a directory: inspect takes a manifest (.toml)"; }},
      {"plugin_of_the_wrong_kind", [](Case& c) { rewrite_manifest(c, "path = \"kiln_mlp\"", "path = \"kiln_synthetic\""); c.args = fit(c); c.names = "kiln_synthetic"; }},
      // --- a model and data that do not fit together ---------------------------------
      // Seen in a sample batch before anything runs (ABI 1.5, check_batch),
      // not at the first step after the run directory was written.
      {"model_in_features_not_the_datas", [](Case& c) {
         rewrite_manifest(c, "features = 32\nclasses", "features = 20\nclasses");
         c.args = fit(c);
         c.names = "failed in check_batch on rank 0: the model does not fit the data module's batches (input [2, 20] "
                   "Float): input has 20 features per sample but in_features = 32";
       }},
      {"model_in_features_not_the_datas_in_validate", [](Case& c) {
         rewrite_manifest(c, "features = 32\nclasses", "features = 20\nclasses");
         c.args = {"validate", c.manifest.string(), "--ckpt", c.good.string()};
         c.names = "input has 20 features per sample but in_features = 32";
       }},
      // --- data files --------------------------------------------------------------
      {"data_idx_bad_magic", [](Case& c) {
         fashion_mnist_damaged(c, "train-labels-idx1-ubyte.gz",
                               [](std::string& b) { b = std::string("\x00\x00\x08\x03\x00\x00\x00\x02\x01\x02", 10); });
       }},
      {"data_idx_truncated", [](Case& c) {
         fashion_mnist_damaged(c, "t10k-labels-idx1-ubyte.gz",
                               [](std::string& b) { b = std::string("\x00\x00\x08\x01\x00\x00\x27\x10\x01\x02", 10); });
       }},
      {"data_idx_not_gzip_nor_idx", [](Case& c) {
         fashion_mnist_damaged(c, "train-images-idx3-ubyte.gz", [](std::string& b) { b = "hello"; });
       }},
      {"data_token_file_missing", [](Case& c) { token_stream_case(c, "nope.bin", "block_size = 16\n"); c.names = "nope.bin"; }},
      {"data_token_file_odd_length_for_uint16", [](Case& c) {
         put_bytes(c.dir / "odd.bin", std::string(1001, 'a'));
         token_stream_case(c, "odd.bin", "token_bytes = 2\nblock_size = 16\n");
         c.names = "odd.bin";
       }},
      {"data_block_size_longer_than_the_text", [](Case& c) {
         put_bytes(c.dir / "short.txt", std::string(40, 'a'));
         token_stream_case(c, "short.txt", "block_size = 64\nval_fraction = 0.0\n");
         c.names = "block_size";
       }},
      {"data_block_size_longer_than_the_val_split", [](Case& c) {
         put_bytes(c.dir / "text.txt", std::string(1000, 'a'));
         token_stream_case(c, "text.txt", "block_size = 16\nval_fraction = 0.01\n");
         c.names = "block_size";
       }},
  };
}

// ctest shows the case's name, not its bytes.
void PrintTo(const BadInput& input, std::ostream* out) { *out << input.name; }

class Catalogue : public testing::TestWithParam<BadInput> {
 protected:
  static void SetUpTestSuite() {
    if (!g_checkpoint.empty()) return;
    TempDir dir;
    write_file(dir / "run.toml", manifest_text(dir));
    ProcessResult r = kiln({"fit", (dir / "run.toml").string()}, {.timeout = kTimeout});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    g_checkpoint = read_file(dir / "ckpt" / "last.ckpt");
    r = kiln({"fit", (dir / "run.toml").string(), "--set", "model.hidden=[8]", "--set",
              "checkpoint.dir=" + (dir / "other").string()},
             {.timeout = kTimeout});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    g_other_model_checkpoint = read_file(dir / "other" / "last.ckpt");
  }
};

TEST_P(Catalogue, OneLineNamingTheInputExit2AndNothingWritten) {
  ASSERT_FALSE(g_checkpoint.empty());
  const BadInput& input = GetParam();
  Case c;
  prepare(c);
  input.make(c);
  ASSERT_FALSE(c.args.empty());
  const auto before = snapshot(c.dir.path());
  const ProcessResult r = kiln(c.args, {.timeout = kTimeout});
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Exactly one error line, naming the input.
  std::istringstream lines(r.output);
  std::vector<std::string> errors;
  for (std::string line; std::getline(lines, line);)
    if (line.find("error") != std::string::npos || line.find("Error") != std::string::npos) errors.push_back(line);
  ASSERT_EQ(errors.size(), 1u) << r.output;
  EXPECT_EQ(errors[0].rfind("kiln: error: ", 0), 0u) << r.output;
  EXPECT_NE(errors[0].find(c.names), std::string::npos) << "the line must name '" << c.names << "'\n" << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(c.dir.path()), before) << "a refused input must leave every file as it was\n" << r.output;
}

INSTANTIATE_TEST_SUITE_P(BadInputs, Catalogue, testing::ValuesIn(catalogue()),
                         [](const testing::TestParamInfo<BadInput>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kiln::test
