// Unit tests for the run manifest (runtime/config/manifest.cpp): parsing,
// validation with file:line:col messages, plugin lookup, --set overrides.
#include "config/duration.hpp"
#include "config/manifest.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "util/errors.hpp"

namespace fs = std::filesystem;
using kiln::BatchLimit;
using kiln::InputError;
using kiln::Manifest;
using kiln::PluginSearchPath;

namespace {

// The smallest valid manifest: two lines of plugin tables.
const char* const kMinimal = R"([model]
path = "kiln_mlp"

[data]
path = "kiln_synthetic"
)";

void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p).flush();
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln_manifest_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = fs::canonical(tmpl);
    plugins_ = root_ / "plugins";
    touch(plugins_ / "libkiln_mlp.so");
    touch(plugins_ / "libkiln_synthetic.so");
    touch(plugins_ / "libkiln_early_stopping.so");
    touch(plugins_ / "kiln_cnn.so");  // no lib prefix
    search_.dirs = {plugins_};
    cwd_ = fs::current_path();
  }

  void TearDown() override {
    fs::current_path(cwd_);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  fs::path write(const std::string& relative, const std::string& text) {
    const fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }

  Manifest load(const std::string& text, const std::vector<std::string>& overrides = {}) {
    return kiln::load_manifest(write("run.toml", text), overrides, search_);
  }

  // The InputError message of loading `text` (fails the test if none).
  std::string error(const std::string& text, const std::vector<std::string>& overrides = {}) {
    return error_of(write("run.toml", text), overrides);
  }

  std::string error_of(const fs::path& file, const std::vector<std::string>& overrides = {}) {
    try {
      kiln::load_manifest(file, overrides, search_);
    } catch (const InputError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << "message has a newline: " << message;
      return message;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
      return "";
    }
    ADD_FAILURE() << "expected InputError, manifest was accepted";
    return "";
  }

  std::string manifest_path() const { return (root_ / "run.toml").string(); }
  // "<manifest>:<line>:<col>: "
  std::string at(int line, int column) const {
    return manifest_path() + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
  }

  fs::path root_;
  fs::path plugins_;
  fs::path cwd_;
  PluginSearchPath search_;
};

// ---------------------------------------------------------------------------
// Valid manifests

TEST_F(ManifestTest, FullManifestWithAllTables) {
  const Manifest m = load(R"(# a full run
[run]
name = "exp7"
dir = "out/exp7"
seed = 1234
deterministic = true
threads = 4
device = "cuda:1"
log_level = "debug"

[model]
path = "kiln_mlp"
id = "mlp"
hidden = [128, 64]
activation = "gelu"

[data]
path = "kiln_synthetic"
samples = 1000

[[callbacks]]
path = "kiln_early_stopping"
monitor = "val_loss"
patience = 3

[trainer]
max_epochs = 20
max_steps = 5000
batch_size = 64
eval_batch_size = 256
accumulate_grad_batches = 2
gradient_clip_val = 1.5
gradient_clip_algorithm = "value"
check_val_every_n_epoch = 2
limit_train_batches = 0.5
limit_val_batches = 10
limit_test_batches = 1.0
limit_predict_batches = 0
fast_dev_run = false
shuffle = false
drop_last = true
data_workers = 3
prefetch_batches = 8
log_every_n_steps = 10
progress = "lines"
test_after_fit = true

[optimizer]
name = "sgd"
lr = 0.1
weight_decay = 1e-4
momentum = 0.9
nesterov = true
betas = [0.8, 0.99]
eps = 1e-6

[scheduler]
name = "cosine"
interval = "step"
step_size = 3
gamma = 0.5
t_max = 100
eta_min = 1e-5
warmup_steps = 10
warmup_start_factor = 0.1

[checkpoint]
dir = "ckpts"
every_n_epochs = 0
every_n_steps = 500
monitor = "val_loss"
mode = "max"
save_top_k = 3
save_last = false

[distributed]
processes = 4
backend = "nccl"
timeout_s = 30.5
master_addr = "10.0.0.1"
master_port = 29500
)");
  EXPECT_EQ(m.file, root_ / "run.toml");
  EXPECT_TRUE(m.file.is_absolute());

  EXPECT_EQ(m.run.name, "exp7");
  EXPECT_EQ(m.run.dir, root_ / "out" / "exp7");
  EXPECT_EQ(m.run.seed, 1234u);
  EXPECT_TRUE(m.run.deterministic);
  EXPECT_EQ(m.run.threads, 4);
  EXPECT_EQ(m.run.device, "cuda:1");
  EXPECT_EQ(m.run.log_level, kiln::LogLevel::debug);

  EXPECT_EQ(m.model.slot, "model");
  EXPECT_EQ(m.model.path_text, "kiln_mlp");
  EXPECT_EQ(m.model.path, plugins_ / "libkiln_mlp.so");
  EXPECT_EQ(m.model.id, "mlp");
  EXPECT_EQ(m.model.where, at(11, 1).substr(0, at(11, 1).size() - 2));
  EXPECT_EQ(m.data.slot, "data");
  EXPECT_EQ(m.data.path, plugins_ / "libkiln_synthetic.so");
  EXPECT_EQ(m.data.id, "");
  ASSERT_EQ(m.callbacks.size(), 1u);
  EXPECT_EQ(m.callbacks[0].slot, "callbacks[0]");
  EXPECT_EQ(m.callbacks[0].path, plugins_ / "libkiln_early_stopping.so");

  EXPECT_EQ(m.trainer.max_epochs, 20);
  EXPECT_EQ(m.trainer.max_steps, 5000);
  EXPECT_EQ(m.trainer.batch_size, 64);
  EXPECT_EQ(m.trainer.eval_batch_size, 256);
  EXPECT_EQ(m.trainer.accumulate_grad_batches, 2);
  EXPECT_DOUBLE_EQ(m.trainer.gradient_clip_val, 1.5);
  EXPECT_EQ(m.trainer.gradient_clip_algorithm, kiln::GradientClipAlgorithm::value);
  EXPECT_EQ(m.trainer.check_val_every_n_epoch, 2);
  EXPECT_TRUE(m.trainer.limit_train_batches.is_fraction);
  EXPECT_DOUBLE_EQ(m.trainer.limit_train_batches.fraction, 0.5);
  EXPECT_FALSE(m.trainer.limit_val_batches.is_fraction);
  EXPECT_EQ(m.trainer.limit_val_batches.count, 10);
  EXPECT_TRUE(m.trainer.limit_test_batches.is_fraction);
  EXPECT_DOUBLE_EQ(m.trainer.limit_test_batches.fraction, 1.0);
  EXPECT_FALSE(m.trainer.limit_predict_batches.is_fraction);
  EXPECT_EQ(m.trainer.limit_predict_batches.count, 0);
  EXPECT_EQ(m.trainer.fast_dev_run, 0);
  EXPECT_FALSE(m.trainer.shuffle);
  EXPECT_TRUE(m.trainer.drop_last);
  EXPECT_EQ(m.trainer.data_workers.value, 3);
  EXPECT_EQ(m.trainer.prefetch_batches.value, 8);
  EXPECT_EQ(m.trainer.log_every_n_steps, 10);
  EXPECT_EQ(m.trainer.progress, kiln::ProgressMode::lines);
  EXPECT_TRUE(m.trainer.test_after_fit);

  EXPECT_EQ(m.optimizer.name, kiln::OptimizerName::sgd);
  EXPECT_DOUBLE_EQ(m.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(m.optimizer.weight_decay, 1e-4);
  EXPECT_DOUBLE_EQ(m.optimizer.momentum, 0.9);
  EXPECT_TRUE(m.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(m.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(m.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(m.optimizer.eps, 1e-6);

  EXPECT_EQ(m.scheduler.name, kiln::SchedulerName::cosine);
  EXPECT_EQ(m.scheduler.interval, kiln::SchedulerInterval::step);
  EXPECT_EQ(m.scheduler.step_size, 3);
  EXPECT_DOUBLE_EQ(m.scheduler.gamma, 0.5);
  EXPECT_EQ(m.scheduler.t_max, 100);
  EXPECT_DOUBLE_EQ(m.scheduler.eta_min, 1e-5);
  EXPECT_EQ(m.scheduler.warmup_steps, 10);
  EXPECT_DOUBLE_EQ(m.scheduler.warmup_start_factor, 0.1);

  EXPECT_TRUE(m.checkpoint.enabled);
  EXPECT_EQ(m.checkpoint.dir, root_ / "ckpts");
  EXPECT_EQ(m.checkpoint.every_n_epochs, 0);
  EXPECT_EQ(m.checkpoint.every_n_steps, 500);
  EXPECT_EQ(m.checkpoint.monitor, "val_loss");
  EXPECT_EQ(m.checkpoint.mode, kiln::MonitorMode::max);
  EXPECT_EQ(m.checkpoint.save_top_k, 3);
  EXPECT_FALSE(m.checkpoint.save_last);

  EXPECT_EQ(m.distributed.processes, 4);
  EXPECT_EQ(m.distributed.backend, kiln::DistributedBackend::nccl);
  EXPECT_DOUBLE_EQ(m.distributed.timeout_s, 30.5);
  EXPECT_EQ(m.distributed.master_addr, "10.0.0.1");
  EXPECT_EQ(m.distributed.master_port, 29500);

  // The text round-trips and carries every table.
  const toml::table text = toml::parse(m.text);
  EXPECT_EQ(text["trainer"]["max_epochs"].value<int64_t>(), 20);
  EXPECT_EQ(text["model"]["path"].value<std::string>(), "kiln_mlp");
  EXPECT_EQ(text["callbacks"][0]["patience"].value<int64_t>(), 3);
}

TEST_F(ManifestTest, MinimalManifestGetsDefaults) {
  const Manifest m = load(kMinimal);
  const kiln::TrainerConfig t;
  const kiln::OptimizerConfig o;
  const kiln::SchedulerConfig s;
  const kiln::DistributedConfig d;

  EXPECT_EQ(m.run.name, "run");
  EXPECT_EQ(m.run.dir, root_ / "runs" / "run");
  EXPECT_EQ(m.run.seed, 0u);
  EXPECT_FALSE(m.run.deterministic);
  EXPECT_EQ(m.run.threads, 0);
  EXPECT_EQ(m.run.device, "auto");
  EXPECT_EQ(m.run.log_level, kiln::LogLevel::info);
  EXPECT_EQ(m.trainer.precision, kiln::Precision::fp32);

  EXPECT_TRUE(m.callbacks.empty());
  EXPECT_EQ(m.model.config_toml.find_first_not_of(" \n"), std::string::npos) << m.model.config_toml;

  EXPECT_EQ(m.trainer.max_epochs, 10);
  EXPECT_EQ(m.trainer.max_epochs, t.max_epochs);
  EXPECT_EQ(m.trainer.max_steps, -1);
  EXPECT_EQ(m.trainer.batch_size, 32);
  EXPECT_EQ(m.trainer.eval_batch_size, 0);
  EXPECT_EQ(m.trainer.accumulate_grad_batches, 1);
  EXPECT_EQ(m.trainer.gradient_clip_val, 0.0);
  EXPECT_EQ(m.trainer.gradient_clip_algorithm, kiln::GradientClipAlgorithm::norm);
  EXPECT_EQ(m.trainer.check_val_every_n_epoch, 1);
  for (const BatchLimit* l : {&m.trainer.limit_train_batches, &m.trainer.limit_val_batches,
                              &m.trainer.limit_test_batches, &m.trainer.limit_predict_batches}) {
    EXPECT_TRUE(l->is_fraction);
    EXPECT_EQ(l->fraction, 1.0);
    EXPECT_EQ(l->apply(17), 17);
  }
  EXPECT_EQ(m.trainer.fast_dev_run, 0);
  EXPECT_TRUE(m.trainer.shuffle);
  EXPECT_FALSE(m.trainer.drop_last);
  EXPECT_TRUE(m.trainer.data_workers.is_auto());
  EXPECT_TRUE(m.trainer.prefetch_batches.is_auto());
  EXPECT_EQ(m.trainer.data_workers.value, t.data_workers.value);
  EXPECT_EQ(m.trainer.log_every_n_steps, 50);
  EXPECT_EQ(m.trainer.progress, kiln::ProgressMode::automatic);
  EXPECT_FALSE(m.trainer.test_after_fit);

  EXPECT_EQ(m.optimizer.name, kiln::OptimizerName::adam);
  EXPECT_EQ(m.optimizer.lr, o.lr);
  EXPECT_EQ(m.optimizer.beta1, 0.9);
  EXPECT_EQ(m.optimizer.beta2, 0.999);
  EXPECT_EQ(m.optimizer.eps, o.eps);
  EXPECT_EQ(m.scheduler.name, kiln::SchedulerName::none);
  EXPECT_EQ(m.scheduler.interval, kiln::SchedulerInterval::epoch);
  EXPECT_EQ(m.scheduler.step_size, s.step_size);

  EXPECT_FALSE(m.checkpoint.enabled);
  EXPECT_EQ(m.checkpoint.dir, root_ / "runs" / "run" / "checkpoints");
  EXPECT_EQ(m.checkpoint.mode, kiln::MonitorMode::min);
  EXPECT_EQ(m.checkpoint.save_top_k, 1);
  EXPECT_TRUE(m.checkpoint.save_last);

  EXPECT_EQ(m.distributed.processes, 1);
  EXPECT_EQ(m.distributed.backend, kiln::DistributedBackend::automatic);
  EXPECT_EQ(m.distributed.timeout_s, d.timeout_s);
  EXPECT_EQ(m.distributed.master_addr, "127.0.0.1");
  EXPECT_EQ(m.distributed.master_port, 0);
}

TEST_F(ManifestTest, RunDirDefaultsToRunsSlashName) {
  const Manifest m = load(std::string("[run]\nname = \"baseline\"\n") + kMinimal);
  EXPECT_EQ(m.run.dir, root_ / "runs" / "baseline");
  EXPECT_EQ(m.checkpoint.dir, root_ / "runs" / "baseline" / "checkpoints");
}

TEST_F(ManifestTest, CheckpointTableEnablesAndDirFollowsRunDir) {
  const Manifest m = load(std::string("[run]\ndir = \"/abs/elsewhere\"\n[checkpoint]\n") + kMinimal);
  EXPECT_TRUE(m.checkpoint.enabled);
  EXPECT_EQ(m.run.dir, fs::path("/abs/elsewhere"));
  EXPECT_EQ(m.checkpoint.dir, fs::path("/abs/elsewhere/checkpoints"));

  const Manifest off = load(std::string("[checkpoint]\nenabled = false\n") + kMinimal);
  EXPECT_FALSE(off.checkpoint.enabled);
}

// Lightning writes precision as a number or a string; both name the same choice.
TEST_F(ManifestTest, PrecisionTakesLightningsNames) {
  EXPECT_EQ(load(std::string("[trainer]\nprecision = 32\n") + kMinimal).trainer.precision, kiln::Precision::fp32);
  EXPECT_EQ(load(std::string("[trainer]\nprecision = \"32\"\n") + kMinimal).trainer.precision, kiln::Precision::fp32);
  EXPECT_EQ(load(std::string("[trainer]\nprecision = \"bf16-mixed\"\n") + kMinimal).trainer.precision,
            kiln::Precision::bf16_mixed);
  EXPECT_EQ(load(kMinimal, {"trainer.precision=16-mixed"}).trainer.precision, kiln::Precision::fp16_mixed);
}

TEST(DurationTest, ReadsLightningsMaxTimeForms) {
  EXPECT_EQ(kiln::parse_duration_seconds("00:30:00"), 1800);
  EXPECT_EQ(kiln::parse_duration_seconds("01:00:00:05"), 86405);
  EXPECT_EQ(kiln::parse_duration_seconds("100:00:00"), 360000);  // hours may pass 24 without days
  EXPECT_EQ(kiln::parse_duration_seconds("00:00:00"), 0);
  for (const char* bad : {"", "30", "00:30", "1:2:3:4:5", "00:60:00", "00:00:60", "01:24:00:00", "aa:bb:cc",
                          "-1:00:00", "00::00", " 00:30:00", "00:30:00s"})
    EXPECT_FALSE(kiln::parse_duration_seconds(bad)) << bad;
}

TEST_F(ManifestTest, MaxTimeAndValCheckInterval) {
  const Manifest m = load(std::string("[trainer]\nmax_time = \"00:12:00\"\nval_check_interval = 0.25\n") + kMinimal);
  EXPECT_EQ(m.trainer.max_time, "00:12:00");
  EXPECT_TRUE(m.trainer.val_check_interval.is_fraction);
  EXPECT_EQ(m.trainer.val_check_interval.fraction, 0.25);
  EXPECT_EQ(load(kMinimal, {"trainer.val_check_interval=100"}).trainer.val_check_interval.count, 100);
  // max_time alone bounds the run.
  EXPECT_EQ(load(std::string("[trainer]\nmax_epochs = -1\nmax_time = \"00:00:10\"\n") + kMinimal).trainer.max_epochs, -1);
}

TEST_F(ManifestTest, MaxTimeThatDoesNotParseIsNamed) {
  EXPECT_EQ(error(std::string("[trainer]\nmax_time = \"30m\"\n") + kMinimal),
            at(2, 12) + "trainer.max_time must be a duration \"HH:MM:SS\" or \"DD:HH:MM:SS\" (e.g. \"00:30:00\" for "
                        "30 minutes), not '30m'");
}

TEST_F(ManifestTest, ValCheckIntervalOfZeroIsRefused) {
  EXPECT_NE(error(std::string("[trainer]\nval_check_interval = 0\n") + kMinimal).find("val_check_interval must be above 0"),
            std::string::npos);
}

TEST_F(ManifestTest, IntegersAreAcceptedAsFloats) {
  const Manifest m = load(std::string(R"([optimizer]
lr = 1
weight_decay = 0
betas = [0, 0.5]
[trainer]
gradient_clip_val = 2
limit_train_batches = 1.0
[distributed]
timeout_s = 30
[scheduler]
gamma = 1
warmup_start_factor = 0
)") + kMinimal);
  EXPECT_DOUBLE_EQ(m.optimizer.lr, 1.0);
  EXPECT_DOUBLE_EQ(m.optimizer.beta1, 0.0);
  EXPECT_DOUBLE_EQ(m.optimizer.beta2, 0.5);
  EXPECT_DOUBLE_EQ(m.trainer.gradient_clip_val, 2.0);
  EXPECT_DOUBLE_EQ(m.distributed.timeout_s, 30.0);
  EXPECT_DOUBLE_EQ(m.scheduler.gamma, 1.0);
}

// ---------------------------------------------------------------------------
// Unknown tables and keys

TEST_F(ManifestTest, UnknownTableWithSuggestion) {
  const std::string message = error(std::string(kMinimal) + "\n[trainr]\nmax_epochs = 3\n");
  EXPECT_EQ(message, at(7, 1) + "unknown table 'trainr' (did you mean 'trainer'?)");
}

TEST_F(ManifestTest, UnknownTableWithoutSuggestionListsTheKnownOnes) {
  const std::string message = error(std::string(kMinimal) + "[wandb]\nproject = 1\n");
  EXPECT_EQ(message.rfind(at(6, 1) + "unknown table 'wandb' (known tables: run, model, data, callbacks,", 0), 0u)
      << message;
}

// ---------------------------------------------------------------------------
// [logging] loggers: an array of names from a closed set

TEST_F(ManifestTest, LoggersDefaultToCsvAndTakeAnyOfTheKnownNames) {
  EXPECT_EQ(load(kMinimal).logging.loggers, std::vector<std::string>{"csv"});
  const Manifest m = load(std::string(kMinimal) + "[logging]\nloggers = [\"tensorboard\", \"jsonl\"]\n");
  EXPECT_EQ(m.logging.loggers, (std::vector<std::string>{"tensorboard", "jsonl"}));
  EXPECT_TRUE(load(std::string(kMinimal) + "[logging]\nloggers = []\n").logging.loggers.empty());
}

TEST_F(ManifestTest, AnUnknownLoggerIsNamedWithTheKnownOnesAndASuggestion) {
  EXPECT_EQ(error(std::string(kMinimal) + "[logging]\nloggers = [\"csv\", \"tensorbord\"]\n"),
            at(7, 19) + "logging.loggers[1] must be 'csv', 'jsonl', 'tensorboard' or 'mlflow', not 'tensorbord' (did you mean "
                        "'tensorboard'?)");
  EXPECT_EQ(error(std::string(kMinimal) + "[logging]\nloggers = [\"csv\", \"csv\"]\n"),
            at(7, 19) + "logging.loggers lists 'csv' twice");
  EXPECT_EQ(error(std::string(kMinimal) + "[logging]\nloggers = \"jsonl\"\n"),
            at(7, 11) + "logging.loggers must be an array of 'csv', 'jsonl', 'tensorboard' or 'mlflow', not a string (write "
                        "[\"jsonl\"])");
}

TEST_F(ManifestTest, TopLevelKeyThatBelongsInATable) {
  const std::string message = error(std::string("seed = 1\n") + kMinimal);
  EXPECT_EQ(message.rfind(at(1, 1) + "unknown top-level key 'seed' (it belongs in [run]", 0), 0u) << message;
}

TEST_F(ManifestTest, UnknownKeyHasLineColumnAndSuggestion) {
  const std::string message = error(std::string(kMinimal) + R"(
[trainer]
batch_size = 8
max_epoch = 3
)");
  EXPECT_EQ(message, at(9, 1) + "unknown key 'max_epoch' in [trainer] (did you mean 'max_epochs'?)");
}

TEST_F(ManifestTest, UnknownKeyColumnFollowsIndentation) {
  const std::string message = error(std::string("[optimizer]\n    lerning_rate = 0.1\n") + kMinimal);
  EXPECT_EQ(message.rfind(at(2, 5) + "unknown key 'lerning_rate' in [optimizer]", 0), 0u) << message;
}

// A UTF-8 byte-order mark before the first line, as editors on Windows
// save one: accepted, and positions are those the editor shows. It was
// refused as "a non-ASCII character outside a string".
TEST_F(ManifestTest, AByteOrderMarkAtTheStartIsAccepted) {
  const std::string bom = "\xEF\xBB\xBF";
  const Manifest m = load(bom + "[trainer]\nmax_epochs = 7\n" + kMinimal);
  EXPECT_EQ(m.trainer.max_epochs, 7);
  EXPECT_EQ(m.text, load(std::string("[trainer]\nmax_epochs = 7\n") + kMinimal).text);
  EXPECT_EQ(error(bom + "[optimizer]\n    lerning_rate = 0.1\n" + kMinimal).rfind(at(2, 5) + "unknown key 'lerning_rate'", 0),
            0u);
  // Line 1's columns start after the mark.
  EXPECT_EQ(error(bom + "a\xC6\x93 = 1\n" + kMinimal).rfind(at(1, 2) + "a non-ASCII character outside a string", 0),
            0u);
}

TEST_F(ManifestTest, AByteOrderMarkAnywhereElseIsRefusedByName) {
  const std::string bom = "\xEF\xBB\xBF";
  EXPECT_EQ(error(std::string(kMinimal) + bom + "[trainer]\n"),
            at(6, 1) + "a byte-order mark (U+FEFF) outside a string, not at the start of the file (only the file's "
                       "first bytes may hold one); delete it");
  EXPECT_EQ(error(bom + bom + kMinimal).rfind(at(1, 1) + "a byte-order mark (U+FEFF)", 0), 0u) << "one mark, not two";
  EXPECT_EQ(error(std::string("[trainer]\nmax_epochs = 7") + bom + "\n" + kMinimal)
                .rfind(at(2, 15) + "a byte-order mark (U+FEFF)", 0),
            0u);
}

TEST_F(ManifestTest, UnknownKeyFromDottedKeyAtTopLevel) {
  // Before any [table] header, a dotted key defines a table implicitly.
  const std::string message = error(std::string("trainer.max_epoch = 3\n") + kMinimal);
  EXPECT_EQ(message, at(1, 9) + "unknown key 'max_epoch' in [trainer] (did you mean 'max_epochs'?)");
}

TEST_F(ManifestTest, UnknownKeyThatBelongsInAnotherTable) {
  const std::string message = error(std::string("[trainer]\nlr = 0.1\n") + kMinimal);
  EXPECT_EQ(message, at(2, 1) + "unknown key 'lr' in [trainer] (it belongs in [optimizer])");
}

// The keys an earlier kiln read say what replaced them.
TEST_F(ManifestTest, ARenamedKeySaysItsNewName) {
  EXPECT_EQ(error(std::string("[trainer]\nprefetch_threads = 2\n") + kMinimal),
            at(2, 1) + "unknown key 'prefetch_threads' in [trainer] (renamed: use trainer.data_workers)");
  EXPECT_EQ(error(std::string("[trainer]\nprefetch = \"inline\"\n") + kMinimal),
            at(2, 1) + "unknown key 'prefetch' in [trainer] (renamed: use trainer.data_workers: 0 for inline, a "
                       "count of threads, or \"auto\")");
  EXPECT_EQ(error(std::string("[trainer]\nprefetch_depth = 8\n") + kMinimal),
            at(2, 1) + "unknown key 'prefetch_depth' in [trainer] (renamed: use trainer.prefetch_batches)");
}

TEST_F(ManifestTest, UnknownKeyWithNoNearMatchListsKnownKeys) {
  const std::string message = error(std::string("[distributed]\nzzzzzz = 1\n") + kMinimal);
  EXPECT_EQ(message, at(2, 1) +
                         "unknown key 'zzzzzz' in [distributed] (known keys: processes, backend, intra_host, "
                         "gradient_compression, shard, bucket_mb, prefetch, timeout_s, master_addr, master_port, max_restarts)");
}

TEST_F(ManifestTest, FirstErrorInFileOrderWins) {
  const std::string message = error(std::string("[trainer]\nzeta = 1\nbatch_size = 0\nalpha = 2\n") + kMinimal);
  EXPECT_EQ(message.rfind(at(2, 1) + "unknown key 'zeta'", 0), 0u) << message;
}

// ---------------------------------------------------------------------------
// Types

TEST_F(ManifestTest, WrongTypeNamesTheExpectedType) {
  const std::string message = error(std::string("[trainer]\nmax_epochs = \"three\"\n") + kMinimal);
  EXPECT_EQ(message, at(2, 14) + "trainer.max_epochs must be an integer, not a string");
}

TEST_F(ManifestTest, QuotedNumberGetsAHint) {
  const std::string message = error(std::string("[trainer]\nmax_epochs = \"3\"\n") + kMinimal);
  EXPECT_EQ(message, at(2, 14) + "trainer.max_epochs must be an integer, not a string (write 3 without quotes)");
}

TEST_F(ManifestTest, FloatWhereIntegerIsExpected) {
  const std::string message = error(std::string("[trainer]\nbatch_size = 32.0\n") + kMinimal);
  EXPECT_EQ(message, at(2, 14) + "trainer.batch_size must be an integer, not a float (write 32, without a decimal point)");
}

TEST_F(ManifestTest, WrongTypeForNumberBooleanAndString) {
  EXPECT_EQ(error(std::string("[optimizer]\nlr = \"fast\"\n") + kMinimal),
            at(2, 6) + "optimizer.lr must be a number, not a string");
  EXPECT_EQ(error(std::string("[trainer]\nshuffle = 1\n") + kMinimal),
            at(2, 11) + "trainer.shuffle must be a boolean (true or false), not an integer");
  EXPECT_EQ(error(std::string("[run]\nname = 7\n") + kMinimal), at(2, 8) + "run.name must be a string, not an integer");
  EXPECT_EQ(error(std::string("[optimizer]\nbetas = 0.9\n") + kMinimal),
            at(2, 9) + "optimizer.betas must be an array of two numbers, e.g. [0.9, 0.999], not a float");
}

TEST_F(ManifestTest, HostTableMustBeATable) {
  EXPECT_EQ(error(std::string("trainer = 3\n") + kMinimal), at(1, 1) + "[trainer] must be a table, not an integer");
  EXPECT_NE(error(std::string("[[trainer]]\nmax_epochs = 1\n") + kMinimal).find("(write [trainer], not [[trainer]])"),
            std::string::npos);
}

// ---------------------------------------------------------------------------
// Enums: each gets its choices and a suggestion

struct EnumCase {
  std::string table, key, bad, expected;  // expected: the suggestion in the message
};

class ManifestEnumTest : public ManifestTest, public ::testing::WithParamInterface<EnumCase> {};

TEST_P(ManifestEnumTest, RejectsUnknownValueWithSuggestion) {
  const EnumCase& c = GetParam();
  const std::string message =
      error("[" + c.table + "]\n" + c.key + " = \"" + c.bad + "\"\n" + kMinimal);
  EXPECT_EQ(message.rfind(at(2, static_cast<int>(c.key.size()) + 4) + c.table + "." + c.key + " must be ", 0), 0u)
      << message;
  EXPECT_NE(message.find(", not '" + c.bad + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("(did you mean '" + c.expected + "'?)"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    AllEnums, ManifestEnumTest,
    ::testing::Values(EnumCase{"trainer", "gradient_clip_algorithm", "nrm", "norm"},
                      EnumCase{"trainer", "progress", "bars", "bar"},
                      EnumCase{"optimizer", "name", "adm", "adam"},
                      EnumCase{"optimizer", "name", "AdamW", "adamw"},
                      EnumCase{"scheduler", "name", "cosin", "cosine"},
                      EnumCase{"scheduler", "name", "linear_warmp", "linear_warmup"},
                      EnumCase{"scheduler", "interval", "epochs", "epoch"},
                      EnumCase{"checkpoint", "mode", "mx", "max"},
                      EnumCase{"distributed", "backend", "glo", "gloo"},
                      EnumCase{"run", "log_level", "warning", "warn"},
                      EnumCase{"run", "device", "cpuu", "cpu"},
                      EnumCase{"run", "device", "CUDA:1", "cuda:1"},
                      EnumCase{"run", "device", "gpu", "cuda"},
                      EnumCase{"scheduler", "name", "cos", "cosine"}));

TEST_F(ManifestTest, EnumMessageListsTheChoices) {
  EXPECT_EQ(error(std::string("[optimizer]\nname = \"lamb\"\n") + kMinimal),
            at(2, 8) + "optimizer.name must be 'sgd', 'adam', 'adamw', 'rmsprop' or 'adagrad', not 'lamb'");
  EXPECT_EQ(error(std::string("[run]\ndevice = \"tpu\"\n") + kMinimal),
            at(2, 10) + "run.device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (N = device index), not 'tpu' (did you mean 'cpu'?)");
}

TEST_F(ManifestTest, DeviceAcceptsCpuCudaAndCudaN) {
  for (const std::string device : {"cpu", "cuda", "cuda:0", "cuda:12"}) {
    EXPECT_EQ(load("[run]\ndevice = \"" + device + "\"\n" + kMinimal).run.device, device);
  }
  EXPECT_NE(error(std::string("[run]\ndevice = \"cuda:\"\n") + kMinimal).find("run.device must be"), std::string::npos);
  EXPECT_NE(error(std::string("[run]\ndevice = \"cuda:x\"\n") + kMinimal).find("run.device must be"),
            std::string::npos);
}

// ---------------------------------------------------------------------------
// Value checks

struct RangeCase {
  std::string snippet;   // TOML placed before the minimal manifest
  std::string expected;  // after "<file>:2:<col>: "
};

void PrintTo(const RangeCase& c, std::ostream* out) {
  std::string one = c.snippet;
  for (char& ch : one)
    if (ch == '\n') ch = ' ';
  *out << one;
}

class ManifestRangeTest : public ManifestTest, public ::testing::WithParamInterface<RangeCase> {};

TEST_P(ManifestRangeTest, RejectsOutOfRangeValue) {
  const RangeCase& c = GetParam();
  const std::string message = error(c.snippet + "\n" + kMinimal);
  EXPECT_EQ(message.rfind(manifest_path() + ":", 0), 0u) << message;
  EXPECT_NE(message.find(": " + c.expected), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    AllRanges, ManifestRangeTest,
    ::testing::Values(
        RangeCase{"[trainer]\nbatch_size = 0", "trainer.batch_size must be >= 1, not 0"},
        RangeCase{"[trainer]\naccumulate_grad_batches = 0", "trainer.accumulate_grad_batches must be >= 1, not 0"},
        RangeCase{"[trainer]\nmax_epochs = -2", "trainer.max_epochs must be >= -1, not -2"},
        RangeCase{"[trainer]\nmax_steps = -5", "trainer.max_steps must be >= -1, not -5"},
        RangeCase{"[trainer]\nmax_epochs = -1", "trainer.max_epochs = -1 and trainer.max_steps = -1 would train forever"},
        RangeCase{"[trainer]\ngradient_clip_val = -1.0", "trainer.gradient_clip_val must be >= 0.0, not -1.0"},
        RangeCase{"[trainer]\nlimit_train_batches = -1", "trainer.limit_train_batches must be a number of batches"},
        RangeCase{"[trainer]\nlimit_val_batches = 1.5", "trainer.limit_val_batches must be a fraction in [0.0, 1.0]"},
        RangeCase{"[trainer]\nlimit_test_batches = 3.0", "trainer.limit_test_batches must be a fraction in [0.0, 1.0] (a float) or a number of batches (an integer), not 3.0 (write 3 for a number of batches)"},
        // averaging.start_epoch reads like a batch limit but counts epochs.
        RangeCase{"[averaging]\nkind = \"swa\"\nstart_epoch = 2.0", "averaging.start_epoch must be a fraction in [0.0, 1.0] (a float) or an epoch number (an integer), not 2.0 (write 2 for an epoch number)"},
        RangeCase{"[averaging]\nkind = \"swa\"\nstart_epoch = -1", "averaging.start_epoch must be an epoch number (an integer >= 0)"},
        RangeCase{"[averaging]\nkind = \"swa\"\nstart_epoch = \"last\"", "averaging.start_epoch must be an integer (an epoch number) or a float"},
        RangeCase{"[trainer]\nlimit_predict_batches = \"all\"",
                  "trainer.limit_predict_batches must be an integer (a number of batches) or a float"},
        RangeCase{"[trainer]\nfast_dev_run = -1", "trainer.fast_dev_run must be >= 0, not -1"},
        RangeCase{"[trainer]\nfast_dev_run = \"yes\"",
                  "trainer.fast_dev_run must be a boolean or an integer number of batches, not a string"},
        RangeCase{"[trainer]\ndata_workers = -1", "trainer.data_workers must be between 0 and 1024, not -1"},
        RangeCase{"[trainer]\ndata_workers = \"many\"", "trainer.data_workers must be \"auto\" or an integer, not 'many'"},
        RangeCase{"[trainer]\ndata_workers = 1.5", "trainer.data_workers must be \"auto\" or an integer, not a float"},
        RangeCase{"[trainer]\nprefetch_batches = 0", "trainer.prefetch_batches must be between 1 and 65536, not 0"},
        RangeCase{"[trainer]\nlog_every_n_steps = 0", "trainer.log_every_n_steps must be >= 1, not 0"},
        RangeCase{"[optimizer]\nlr = 0", "optimizer.lr must be > 0.0, not 0"},
        RangeCase{"[optimizer]\nlr = -0.1", "optimizer.lr must be > 0.0, not -0.1"},
        RangeCase{"[optimizer]\nlr = nan", "optimizer.lr must be a finite number, not nan"},
        RangeCase{"[optimizer]\neps = 0.0", "optimizer.eps must be > 0.0, not 0.0"},
        RangeCase{"[optimizer]\nbetas = [0.9]", "optimizer.betas must have two elements [beta1, beta2]"},
        RangeCase{"[optimizer]\nbetas = [0.9, 1.0]", "optimizer.betas[1] must be in [0, 1), not 1.0"},
        RangeCase{"[optimizer]\nbetas = [0.9, \"x\"]", "optimizer.betas[1] must be a number, not a string"},
        RangeCase{"[optimizer]\nname = \"sgd\"\nnesterov = true", "optimizer.nesterov = true needs optimizer.momentum > 0"},
        RangeCase{"[scheduler]\nstep_size = 0", "scheduler.step_size must be >= 1, not 0"},
        RangeCase{"[scheduler]\ngamma = 0", "scheduler.gamma must be > 0.0, not 0"},
        RangeCase{"[scheduler]\nwarmup_start_factor = 2", "scheduler.warmup_start_factor must be between 0.0 and 1.0, not 2"},
        RangeCase{"[checkpoint]\nsave_top_k = -2", "checkpoint.save_top_k must be >= -1, not -2"},
        RangeCase{"[checkpoint]\nsave_top_k = 3", "checkpoint.save_top_k = 3 needs checkpoint.monitor"},
        RangeCase{"[checkpoint]\ndir = \"\"", "checkpoint.dir must not be empty"},
        RangeCase{"[distributed]\nprocesses = 0", "distributed.processes must be >= 1, not 0"},
        RangeCase{"[distributed]\ntimeout_s = 0", "distributed.timeout_s must be > 0.0, not 0"},
        RangeCase{"[distributed]\nmaster_port = 70000", "distributed.master_port must be between 0 and 65535, not 70000"},
        // With device = 'auto' (the default) the device is known only at launch: device_choice_test.
        RangeCase{"[run]\ndevice = \"cpu\"\n[distributed]\nbackend = \"nccl\"",
                  "distributed.backend = 'nccl' needs a CUDA device"},
        RangeCase{"[trainer]\nprecision = 16",
                  "trainer.precision must be '32', 'bf16-mixed', '16-mixed' or 'bf16-true', not '16'"},
        RangeCase{"[trainer]\nprecision = \"bf16-mixed\"\nmaster_weights = false",
                  "trainer.master_weights = false is for trainer.precision = 'bf16-true'"},
        RangeCase{"[trainer]\nprecision = \"bf16-true\"\nmaster_weights = false\n[optimizer]\nname = \"sgd\"",
                  "trainer.master_weights = false is built for adam and adamw"},
        RangeCase{"[run]\nthreads = -1", "run.threads must be between 0 and 4096, not -1"},
        RangeCase{"[run]\nseed = -1", "run.seed must be >= 0, not -1"},
        RangeCase{"[run]\nname = \"\"", "run.name must not be empty"},
        RangeCase{"[run]\nname = \"a/b\"", "run.name must be a plain name, not 'a/b'"}));

TEST_F(ManifestTest, UnboundedTrainingNeedsALimit) {
  EXPECT_EQ(error(std::string("[trainer]\nmax_epochs = -1\n") + kMinimal),
            at(2, 14) +
                "trainer.max_epochs = -1 and trainer.max_steps = -1 would train forever: set max_epochs, max_steps "
                "or max_time to a limit");
  const Manifest m = load(std::string("[trainer]\nmax_epochs = -1\nmax_steps = 100\n") + kMinimal);
  EXPECT_EQ(m.trainer.max_epochs, -1);
  EXPECT_EQ(m.trainer.max_steps, 100);
}

// ---------------------------------------------------------------------------
// Batch limits and fast_dev_run

TEST_F(ManifestTest, LimitBatchesCountVersusFraction) {
  const Manifest m = load(std::string(R"([trainer]
limit_train_batches = 10
limit_val_batches = 0.25
limit_test_batches = 1
limit_predict_batches = 0.0
)") + kMinimal);
  EXPECT_FALSE(m.trainer.limit_train_batches.is_fraction);
  EXPECT_EQ(m.trainer.limit_train_batches.count, 10);
  EXPECT_EQ(m.trainer.limit_train_batches.apply(100), 10);
  EXPECT_EQ(m.trainer.limit_train_batches.apply(4), 4);

  EXPECT_TRUE(m.trainer.limit_val_batches.is_fraction);
  EXPECT_DOUBLE_EQ(m.trainer.limit_val_batches.fraction, 0.25);
  EXPECT_EQ(m.trainer.limit_val_batches.apply(100), 25);
  EXPECT_EQ(m.trainer.limit_val_batches.apply(3), 1);  // floor(0.75) but at least 1

  // An integer 1 is one batch, as in Lightning; 1.0 would be all of them.
  EXPECT_FALSE(m.trainer.limit_test_batches.is_fraction);
  EXPECT_EQ(m.trainer.limit_test_batches.apply(100), 1);

  EXPECT_TRUE(m.trainer.limit_predict_batches.is_fraction);
  EXPECT_EQ(m.trainer.limit_predict_batches.apply(100), 0);
}

TEST(BatchLimitTest, Apply) {
  BatchLimit all;
  EXPECT_EQ(all.apply(0), 0);
  EXPECT_EQ(all.apply(57), 57);

  BatchLimit fraction;
  fraction.is_fraction = true;
  fraction.fraction = 0.1;
  EXPECT_EQ(fraction.apply(100), 10);
  EXPECT_EQ(fraction.apply(99), 9);   // floor
  EXPECT_EQ(fraction.apply(5), 1);    // floor(0.5) = 0, but a positive fraction runs at least one
  EXPECT_EQ(fraction.apply(0), 0);    // nothing available: nothing to run
  fraction.fraction = 0.0;
  EXPECT_EQ(fraction.apply(100), 0);
  fraction.fraction = 1.0;
  EXPECT_EQ(fraction.apply(1000003), 1000003);

  BatchLimit count;
  count.is_fraction = false;
  count.count = 10;
  EXPECT_EQ(count.apply(100), 10);
  EXPECT_EQ(count.apply(7), 7);
  EXPECT_EQ(count.apply(0), 0);
  count.count = 0;
  EXPECT_EQ(count.apply(100), 0);
}

TEST_F(ManifestTest, FastDevRunBoolOrInteger) {
  EXPECT_EQ(load(std::string("[trainer]\nfast_dev_run = true\n") + kMinimal).trainer.fast_dev_run, 1);
  EXPECT_EQ(load(std::string("[trainer]\nfast_dev_run = false\n") + kMinimal).trainer.fast_dev_run, 0);
  EXPECT_EQ(load(std::string("[trainer]\nfast_dev_run = 5\n") + kMinimal).trainer.fast_dev_run, 5);
  EXPECT_EQ(load(std::string("[trainer]\nfast_dev_run = 0\n") + kMinimal).trainer.fast_dev_run, 0);
  EXPECT_EQ(error(std::string("[trainer]\nfast_dev_run = 1.5\n") + kMinimal),
            at(2, 16) + "trainer.fast_dev_run must be a boolean or an integer number of batches, not a float");
}

// ---------------------------------------------------------------------------
// Paths

TEST_F(ManifestTest, RelativePathsResolveAgainstTheManifestNotTheCwd) {
  const fs::path file = write("project/conf/run.toml", R"([run]
dir = "../runs/a"
[checkpoint]
dir = "ckpt"
[model]
path = "../../plugins/libkiln_mlp.so"
[data]
path = "./build/libmydata.so"
[[callbacks]]
path = "/opt/kiln/libcb.so"
[[callbacks]]
path = "cb.so"
)");
  fs::create_directories(root_ / "elsewhere");
  fs::current_path(root_ / "elsewhere");
  const Manifest m = kiln::load_manifest(file, {}, search_);
  const fs::path dir = root_ / "project" / "conf";
  EXPECT_EQ(m.file, file);
  EXPECT_EQ(m.run.dir, root_ / "project" / "runs" / "a");
  EXPECT_EQ(m.checkpoint.dir, dir / "ckpt");
  EXPECT_EQ(m.model.path, plugins_ / "libkiln_mlp.so");
  EXPECT_EQ(m.model.path_text, "../../plugins/libkiln_mlp.so");
  // Paths are not required to exist: the loader reports missing files.
  EXPECT_EQ(m.data.path, dir / "build" / "libmydata.so");
  ASSERT_EQ(m.callbacks.size(), 2u);
  EXPECT_EQ(m.callbacks[0].path, fs::path("/opt/kiln/libcb.so"));
  EXPECT_EQ(m.callbacks[1].path, dir / "cb.so");  // ends in .so: a path, not a name
}

TEST_F(ManifestTest, RelativeManifestPathIsMadeAbsolute) {
  write("sub/run.toml", kMinimal);
  fs::current_path(root_);
  const Manifest m = kiln::load_manifest("sub/run.toml", {}, search_);
  EXPECT_EQ(m.file, root_ / "sub" / "run.toml");
  EXPECT_EQ(m.run.dir, root_ / "sub" / "runs" / "run");
}

TEST_F(ManifestTest, ErrorsNameTheFileAsGiven) {
  write("sub/run.toml", std::string(kMinimal) + "[trainr]\n");
  fs::current_path(root_);
  EXPECT_EQ(error_of("sub/run.toml"), "sub/run.toml:6:1: unknown table 'trainr' (did you mean 'trainer'?)");
}

// ---------------------------------------------------------------------------
// Plugin lookup

TEST_F(ManifestTest, BarePluginNameIsFoundOnTheSearchPath) {
  const fs::path first = root_ / "first";
  touch(first / "kiln_mlp.so");       // N.so in the first directory ...
  touch(first / "libkiln_synthetic.so");
  touch(first / "kiln_synthetic.so");  // ... and libN.so beats N.so in the same directory
  search_.dirs = {first, plugins_};
  const Manifest m = load(R"([model]
path = "kiln_mlp"
[data]
path = "kiln_synthetic"
[[callbacks]]
path = "kiln_cnn"
[[callbacks]]
path = "libkiln_early_stopping"
)");
  EXPECT_EQ(m.model.path, first / "kiln_mlp.so");
  EXPECT_EQ(m.data.path, first / "libkiln_synthetic.so");
  ASSERT_EQ(m.callbacks.size(), 2u);
  EXPECT_EQ(m.callbacks[0].path, plugins_ / "kiln_cnn.so");
  EXPECT_EQ(m.callbacks[1].path, plugins_ / "libkiln_early_stopping.so");
  EXPECT_EQ(m.callbacks[1].path_text, "libkiln_early_stopping");
}

TEST_F(ManifestTest, PluginNotFoundSuggestsAName) {
  const std::string message = error("[model]\npath = \"kiln_mlpp\"\n[data]\npath = \"kiln_synthetic\"\n");
  EXPECT_EQ(message, at(2, 8) + "plugin 'kiln_mlpp' for [model] not found in " + plugins_.string() +
                         " (did you mean 'kiln_mlp'?)");
}

TEST_F(ManifestTest, PluginNotFoundListsEveryDirectory) {
  const fs::path empty = root_ / "empty";
  fs::create_directories(empty);
  search_.dirs = {empty, plugins_, root_ / "missing"};
  const std::string message = error(std::string(kMinimal) + "[[callbacks]]\npath = \"zzz_unrelated\"\n");
  EXPECT_EQ(message, at(7, 8) + "plugin 'zzz_unrelated' for callbacks[0] not found in " + empty.string() + ", " +
                         plugins_.string() + ", " + (root_ / "missing").string() +
                         " (add its directory to KILN_PLUGIN_PATH, or give the path to the .so file)");
}

TEST_F(ManifestTest, PluginNotFoundWithNoSearchDirectories) {
  search_.dirs.clear();
  const std::string message = error(kMinimal);
  EXPECT_EQ(message, at(2, 8) +
                         "plugin 'kiln_mlp' for [model] not found: no plugin directories to search (set "
                         "KILN_PLUGIN_PATH, or give the path to the .so file)");
}

TEST_F(ManifestTest, PluginConfigExcludesHostKeys) {
  const Manifest m = load(R"(# model first
[model]
path = "kiln_mlp"
id = "mlp_v2"
hidden = [64, 32]
activation = "relu"
dropout = 0.1

[model.init]
std = 0.02

[data]
path = "kiln_synthetic"
)");
  EXPECT_EQ(m.model.id, "mlp_v2");
  EXPECT_EQ(m.model.where, manifest_path() + ":2:1");
  const toml::table config = toml::parse(m.model.config_toml);
  EXPECT_FALSE(config.contains("path"));
  EXPECT_FALSE(config.contains("id"));
  EXPECT_EQ(config.size(), 4u) << m.model.config_toml;
  ASSERT_TRUE(config["hidden"].is_array());
  EXPECT_EQ(config["hidden"][0].value<int64_t>(), 64);
  EXPECT_EQ(config["hidden"][1].value<int64_t>(), 32);
  EXPECT_EQ(config["activation"].value<std::string>(), "relu");
  EXPECT_EQ(config["dropout"].value<double>(), 0.1);
  EXPECT_EQ(config["init"]["std"].value<double>(), 0.02);

  EXPECT_TRUE(toml::parse(m.data.config_toml).empty());
}

TEST_F(ManifestTest, PluginTableNeedsAPath) {
  EXPECT_EQ(error("[model]\nhidden = 3\n[data]\npath = \"kiln_synthetic\"\n"),
            at(1, 1) +
                "[model] has no 'path': set path = \"<plugin name>\" (looked up on the plugin path) or the path to "
                "its .so file");
  EXPECT_NE(error("[model]\npth = \"kiln_mlp\"\n[data]\npath = \"kiln_synthetic\"\n")
                .find("(did you mean 'path' instead of 'pth'?)"),
            std::string::npos);
  EXPECT_EQ(error("[model]\npath = 3\n[data]\npath = \"kiln_synthetic\"\n"),
            at(2, 8) + "model.path must be a string, not an integer");
  EXPECT_EQ(error("[model]\npath = \"\"\n[data]\npath = \"kiln_synthetic\"\n"), at(2, 8) + "model.path must not be empty");
  EXPECT_EQ(error("[model]\npath = \"kiln_mlp\"\nid = 1\n[data]\npath = \"kiln_synthetic\"\n"),
            at(3, 6) + "model.id must be a string, not an integer");
}

TEST_F(ManifestTest, ModelAndDataAreRequired) {
  EXPECT_EQ(error("[data]\npath = \"kiln_synthetic\"\n"),
            manifest_path() + ": missing [model] table: add [model] with path = \"<plugin name or .so file>\"");
  EXPECT_EQ(error("[model]\npath = \"kiln_mlp\"\n"),
            manifest_path() + ": missing [data] table: add [data] with path = \"<plugin name or .so file>\"");
  EXPECT_NE(error("").find("missing [model] table"), std::string::npos);
  EXPECT_NE(error(std::string("model = \"kiln_mlp\"\n[data]\npath = \"x.so\"\n")).find("[model] must be a table, not a string"),
            std::string::npos);
}

TEST_F(ManifestTest, CallbacksArrayOfTables) {
  const Manifest m = load(std::string(kMinimal) + R"(
[[callbacks]]
path = "kiln_early_stopping"
monitor = "val_loss"
patience = 3

[[callbacks]]
path = "kiln_cnn"
id = "second"
)");
  ASSERT_EQ(m.callbacks.size(), 2u);
  EXPECT_EQ(m.callbacks[0].slot, "callbacks[0]");
  EXPECT_EQ(m.callbacks[0].where, manifest_path() + ":7:1");
  EXPECT_EQ(m.callbacks[0].id, "");
  const toml::table first = toml::parse(m.callbacks[0].config_toml);
  EXPECT_EQ(first["monitor"].value<std::string>(), "val_loss");
  EXPECT_EQ(first["patience"].value<int64_t>(), 3);
  EXPECT_FALSE(first.contains("path"));
  EXPECT_EQ(m.callbacks[1].slot, "callbacks[1]");
  EXPECT_EQ(m.callbacks[1].where, manifest_path() + ":12:1");
  EXPECT_EQ(m.callbacks[1].id, "second");
  EXPECT_EQ(m.callbacks[1].path, plugins_ / "kiln_cnn.so");
  EXPECT_TRUE(toml::parse(m.callbacks[1].config_toml).empty());
}

TEST_F(ManifestTest, CallbacksMustBeAnArrayOfTables) {
  EXPECT_EQ(error(std::string(kMinimal) + "[callbacks]\npath = \"kiln_cnn\"\n"),
            at(6, 1) +
                "callbacks must be an array of tables, not a table (write [[callbacks]] for each callback, not "
                "[callbacks])");
  EXPECT_EQ(error(std::string("callbacks = [1]\n") + kMinimal),
            at(1, 14) + "callbacks[0] must be a table, not an integer (write each callback as a [[callbacks]] table)");
  EXPECT_EQ(error(std::string(kMinimal) + "[[callbacks]]\nmonitor = \"val_loss\"\n"),
            at(6, 1) +
                "callbacks[0] has no 'path': set path = \"<plugin name>\" (looked up on the plugin path) or the path "
                "to its .so file");
  EXPECT_TRUE(load(std::string("callbacks = []\n") + kMinimal).callbacks.empty());
}

// ---------------------------------------------------------------------------
// --set overrides

TEST_F(ManifestTest, OverrideInteger) {
  const Manifest m = load(std::string("[trainer]\nmax_epochs = 20\n") + kMinimal, {"trainer.max_epochs=3"});
  EXPECT_EQ(m.trainer.max_epochs, 3);
  // The text carries the override (it is what checkpoints record).
  EXPECT_EQ(toml::parse(m.text)["trainer"]["max_epochs"].value<int64_t>(), 3);
}

TEST_F(ManifestTest, OverrideListIntoPluginConfig) {
  const Manifest m = load(std::string("[model]\npath = \"kiln_mlp\"\nhidden = [256, 256]\n[data]\npath = \"kiln_synthetic\"\n"),
                          {"model.hidden=[64]", "model.dropout=0.5"});
  const toml::table config = toml::parse(m.model.config_toml);
  ASSERT_TRUE(config["hidden"].is_array());
  EXPECT_EQ(config["hidden"].as_array()->size(), 1u);
  EXPECT_EQ(config["hidden"][0].value<int64_t>(), 64);
  EXPECT_EQ(config["dropout"].value<double>(), 0.5);
}

TEST_F(ManifestTest, OverrideFallsBackToAString) {
  const Manifest m = load(kMinimal, {"run.name=exp1", "run.device=cuda:0", "checkpoint.monitor = val/loss"});
  EXPECT_EQ(m.run.name, "exp1");
  EXPECT_EQ(m.run.dir, root_ / "runs" / "exp1");
  EXPECT_EQ(m.run.device, "cuda:0");
  EXPECT_EQ(m.checkpoint.monitor, "val/loss");
  // A quoted TOML string works too.
  EXPECT_EQ(load(kMinimal, {"run.name=\"with space\""}).run.name, "with space");
}

TEST_F(ManifestTest, OverrideOfAStringKeyKeepsTheTextAsWritten) {
  // "2024" parses as an integer, but run.name is a string: take the text.
  const Manifest m = load(kMinimal, {"run.name=2024", "model.path=kiln_cnn"});
  EXPECT_EQ(m.run.name, "2024");
  EXPECT_EQ(toml::parse(m.text)["run"]["name"].value<std::string>(), "2024");
  EXPECT_EQ(m.model.path, plugins_ / "kiln_cnn.so");
}

TEST_F(ManifestTest, OverrideCreatesMissingTables) {
  const Manifest m = load(kMinimal, {"checkpoint.every_n_epochs=2", "optimizer.lr=1e-2"});
  EXPECT_TRUE(m.checkpoint.enabled);
  EXPECT_EQ(m.checkpoint.every_n_epochs, 2);
  EXPECT_DOUBLE_EQ(m.optimizer.lr, 0.01);
}

TEST_F(ManifestTest, OverrideCallbackByIndex) {
  const Manifest m = load(std::string(kMinimal) + "[[callbacks]]\npath = \"kiln_early_stopping\"\npatience = 1\n",
                          {"callbacks.0.patience=5", "callbacks[0].min_delta=0.01", "callbacks[1].path=kiln_cnn"});
  ASSERT_EQ(m.callbacks.size(), 2u);  // index == size appends one
  const toml::table config = toml::parse(m.callbacks[0].config_toml);
  EXPECT_EQ(config["patience"].value<int64_t>(), 5);
  EXPECT_EQ(config["min_delta"].value<double>(), 0.01);
  EXPECT_EQ(m.callbacks[1].path, plugins_ / "kiln_cnn.so");
  EXPECT_EQ(m.callbacks[1].where, "--set callbacks[1].path=kiln_cnn");

  // With no [[callbacks]] at all, index 0 creates the array.
  const Manifest created = load(kMinimal, {"callbacks.0.path=kiln_early_stopping"});
  ASSERT_EQ(created.callbacks.size(), 1u);
  EXPECT_EQ(created.callbacks[0].path, plugins_ / "libkiln_early_stopping.so");
}

TEST_F(ManifestTest, OverrideWithUnknownKeyNamesTheSetArgument) {
  EXPECT_EQ(error(kMinimal, {"trainer.max_epoch=3"}),
            "--set trainer.max_epoch=3: unknown key 'max_epoch' in [trainer] (did you mean 'max_epochs'?)");
  // Same when [trainer] is in the file: the key is still the override's.
  EXPECT_EQ(error(std::string("[trainer]\nbatch_size = 4\n") + kMinimal, {"trainer.max_epoch=3"}),
            "--set trainer.max_epoch=3: unknown key 'max_epoch' in [trainer] (did you mean 'max_epochs'?)");
  EXPECT_EQ(error(kMinimal, {"trainr.max_epochs=3"}),
            "--set trainr.max_epochs=3: unknown table 'trainr' (did you mean 'trainer'?)");
}

TEST_F(ManifestTest, OverrideWithWrongTypeOrValueNamesTheSetArgument) {
  EXPECT_EQ(error(std::string("[trainer]\nmax_epochs = 5\n") + kMinimal, {"trainer.max_epochs=abc"}),
            "--set trainer.max_epochs=abc: trainer.max_epochs must be an integer, not a string");
  EXPECT_EQ(error(kMinimal, {"trainer.batch_size=0"}), "--set trainer.batch_size=0: trainer.batch_size must be >= 1, not 0");
  EXPECT_EQ(error(kMinimal, {"optimizer.name=adm"}),
            "--set optimizer.name=adm: optimizer.name must be 'sgd', 'adam', 'adamw', 'rmsprop' or 'adagrad', not 'adm' (did you mean "
            "'adam'?)");
  EXPECT_EQ(error(kMinimal, {"model.path=kiln_mlpp"}),
            "--set model.path=kiln_mlpp: plugin 'kiln_mlpp' for [model] not found in " + plugins_.string() +
                " (did you mean 'kiln_mlp'?)");
}

TEST_F(ManifestTest, MalformedOverrides) {
  const std::string no_equals = error(kMinimal, {"trainer.max_epochs"});
  EXPECT_EQ(no_equals, "--set trainer.max_epochs: expected KEY=VALUE, e.g. --set trainer.max_epochs=3");
  const std::string empty_key = error(kMinimal, {"=3"});
  EXPECT_EQ(empty_key.rfind("--set =3: the key before '=' is empty", 0), 0u) << empty_key;
  const std::string empty_part = error(kMinimal, {"trainer..max_epochs=3"});
  EXPECT_EQ(empty_part.rfind("--set trainer..max_epochs=3: empty key part in 'trainer..max_epochs'", 0), 0u)
      << empty_part;
  const std::string trailing_dot = error(kMinimal, {"trainer.=3"});
  EXPECT_EQ(trailing_dot.rfind("--set trainer.=3: empty key part", 0), 0u) << trailing_dot;
  const std::string bad_index = error(kMinimal, {"callbacks[x].patience=3"});
  EXPECT_EQ(bad_index.rfind("--set callbacks[x].patience=3: 'x' is not an array index", 0), 0u) << bad_index;
}

TEST_F(ManifestTest, OverrideWithEmptyValue) {
  EXPECT_EQ(error(kMinimal, {"run.threads="}),
            "--set run.threads=: the value after '=' is empty (for an empty string write --set run.threads='\"\"')");
  EXPECT_EQ(load(kMinimal, {"checkpoint.monitor=\"\""}).checkpoint.monitor, "");
}

TEST_F(ManifestTest, MessagesStayOnOneLine) {
  // A quoted key or an override may contain a newline; the message escapes it.
  const std::string key = error(std::string("[trainer]\n\"max\\nepochs\" = 1\n") + kMinimal);
  EXPECT_EQ(key, at(2, 1) + "unknown key 'max\\nepochs' in [trainer] (did you mean 'max_epochs'?)");
  const std::string name = error(kMinimal, {"run.name=a\nb"});
  EXPECT_EQ(name.rfind("--set run.name=a\\nb: run.name must be a plain name", 0), 0u) << name;
}

TEST_F(ManifestTest, OverridesThatCannotApply) {
  EXPECT_EQ(error(std::string(kMinimal) + "[[callbacks]]\npath = \"kiln_cnn\"\n", {"callbacks.3.patience=5"}),
            "--set callbacks.3.patience=5: index 3 is out of range: callbacks has 1 entry (use 0..1, where 1 adds one)");
  EXPECT_EQ(error(std::string("[trainer]\nmax_epochs = 5\n") + kMinimal, {"trainer.max_epochs.x=1"}),
            "--set trainer.max_epochs.x=1: cannot set 'x' inside trainer.max_epochs, which is an integer, not a table");
  EXPECT_EQ(error(kMinimal, {"model[0].x=1"}),
            "--set model[0].x=1: model is a table, not an array; use model.0 for a key");
}

TEST_F(ManifestTest, OverridesApplyInOrder) {
  const Manifest m = load(kMinimal, {"trainer.max_epochs=3", "trainer.max_epochs=7", "trainer={batch_size = 2}"});
  EXPECT_EQ(m.trainer.max_epochs, 10);  // the whole table was replaced by the last one
  EXPECT_EQ(m.trainer.batch_size, 2);
  EXPECT_EQ(error(kMinimal, {"trainer={batch_sise = 2}"}),
            "--set trainer={batch_sise = 2}: unknown key 'batch_sise' in [trainer] (did you mean 'batch_size'?)");
}

// ---------------------------------------------------------------------------
// File problems

TEST_F(ManifestTest, MissingFile) {
  EXPECT_EQ(error_of(root_ / "nope.toml"), (root_ / "nope.toml").string() + ": cannot read manifest: No such file or directory");
  fs::current_path(root_);
  EXPECT_EQ(error_of("run.toml"), "run.toml: cannot read manifest: No such file or directory");
}

TEST_F(ManifestTest, DirectoryIsNotAManifest) {
  EXPECT_EQ(error_of(root_), root_.string() + ": cannot read manifest: Is a directory");
}

TEST_F(ManifestTest, SyntaxErrorHasLineAndColumn) {
  const std::string message = error("[model]\npath = \"kiln_mlp\"\nhidden = [64,\n[data]\n");
  EXPECT_EQ(message.rfind(manifest_path() + ":4:", 0), 0u) << message;
  EXPECT_NE(message.find("Error while parsing"), std::string::npos) << message;

  const std::string duplicate = error("[model]\npath = \"a.so\"\npath = \"b.so\"\n");
  EXPECT_EQ(duplicate.rfind(manifest_path() + ":3:", 0), 0u) << duplicate;
}

// ---------------------------------------------------------------------------
// The plugin search path

TEST(PluginSearchPathTest, FromEnvironment) {
  const char* saved = std::getenv("KILN_PLUGIN_PATH");
  const std::string saved_value = saved ? saved : "";
  setenv("KILN_PLUGIN_PATH", "/opt/a::/opt/b/:rel/dir:/opt/a:", 1);
  const PluginSearchPath search = PluginSearchPath::from_environment();
  ASSERT_GE(search.dirs.size(), 3u);
  EXPECT_EQ(search.dirs[0], fs::path("/opt/a"));
  EXPECT_EQ(search.dirs[1], fs::path("/opt/b"));              // trailing '/' dropped, empty entries skipped
  EXPECT_EQ(search.dirs[2], fs::current_path() / "rel/dir");  // relative: from the cwd, made absolute
  // (the repeated /opt/a is listed once)
  for (const auto& dir : search.dirs) {
    EXPECT_FALSE(dir.empty());
    EXPECT_TRUE(dir.is_absolute()) << dir;
  }
  // Anything after KILN_PLUGIN_PATH is the bundled directory, which exists.
  for (std::size_t i = 3; i < search.dirs.size(); ++i) {
    EXPECT_TRUE(fs::is_directory(search.dirs[i])) << search.dirs[i];
    EXPECT_EQ(search.dirs[i].filename(), "plugins");
  }

  unsetenv("KILN_PLUGIN_PATH");
  const PluginSearchPath bare = PluginSearchPath::from_environment();
  EXPECT_EQ(bare.dirs.size(), search.dirs.size() - 3);
  if (saved) setenv("KILN_PLUGIN_PATH", saved_value.c_str(), 1);
}

}  // namespace

// ---------------------------------------------------------------------------
// [[optimizer.groups]]

namespace kiln {
namespace {

TEST_F(ManifestTest, OptimizerGroupsAreReadInOrderWithTheirOwnOptions) {
  const Manifest m = load(std::string(kMinimal) +
                          "\n[optimizer]\nname = \"adamw\"\nweight_decay = 0.01\n\n"
                          "[[optimizer.groups]]\nmatch = [\"*.bias\", \"*norm*\"]\nweight_decay = 0.0\n\n"
                          "[[optimizer.groups]]\nmatch = [\"fc1.*\"]\nlr = 1e-4\nbetas = [0.8, 0.9]\n");
  ASSERT_EQ(m.optimizer.groups.size(), 2u);
  EXPECT_EQ(m.optimizer.groups[0].match, (std::vector<std::string>{"*.bias", "*norm*"}));
  EXPECT_EQ(m.optimizer.groups[0].where, manifest_path() + ":12:9");
  const OptimizerConfig first = m.optimizer.for_group(m.optimizer.groups[0]);
  EXPECT_DOUBLE_EQ(first.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(first.lr, m.optimizer.lr);
  const OptimizerConfig second = m.optimizer.for_group(m.optimizer.groups[1]);
  EXPECT_DOUBLE_EQ(second.lr, 1e-4);
  EXPECT_DOUBLE_EQ(second.weight_decay, 0.01);  // [optimizer]'s
  EXPECT_DOUBLE_EQ(second.beta1, 0.8);
  EXPECT_DOUBLE_EQ(second.beta2, 0.9);
}

TEST_F(ManifestTest, AGroupCanBeAddedWithSet) {
  const Manifest m = load(kMinimal, {"optimizer.groups[0].match=[\"*.bias\"]", "optimizer.groups[0].weight_decay=0"});
  ASSERT_EQ(m.optimizer.groups.size(), 1u);
  EXPECT_EQ(m.optimizer.groups[0].weight_decay, 0.0);
}

TEST_F(ManifestTest, AnUnknownGroupKeyIsNamedWithItsEntry) {
  EXPECT_EQ(error(std::string(kMinimal) + "\n[[optimizer.groups]]\nmatch = [\"*\"]\nweight_decy = 0.0\n"),
            at(9, 1) + "unknown key 'weight_decy' in optimizer.groups[0] (did you mean 'weight_decay'?)");
}

TEST_F(ManifestTest, AGroupWithoutMatchOrWithAnEmptyOneIsRefused) {
  EXPECT_EQ(error(std::string(kMinimal) + "\n[[optimizer.groups]]\nlr = 0.1\n"),
            at(7, 1) + "optimizer.groups[0] has no 'match': every [[optimizer.groups]] entry sets it (glob patterns "
                       "over the parameter names the model reports (`*` any run of characters, dots included; `?` "
                       "one; `[abc]` one of); each must match a parameter)");
  EXPECT_EQ(error(std::string(kMinimal) + "\n[[optimizer.groups]]\nmatch = []\n"),
            at(8, 9) + "optimizer.groups[0].match must list at least one pattern, e.g. [\"*.bias\"]");
  EXPECT_EQ(error(std::string(kMinimal) + "\n[[optimizer.groups]]\nmatch = \"*.bias\"\n"),
            at(8, 9) + "optimizer.groups[0].match must be an array of glob patterns, e.g. [\"*.bias\"], not a string");
}

TEST_F(ManifestTest, AGroupOptionTheOptimizerDoesNotTakeIsRefused) {
  EXPECT_EQ(error(std::string(kMinimal) + "\n[optimizer]\nname = \"adam\"\n\n[[optimizer.groups]]\nmatch = [\"*\"]\n"
                                          "momentum = 0.9\n"),
            at(12, 1) + "optimizer.groups[0].momentum: adam takes no momentum (the options it takes: lr, "
                        "weight_decay, betas, eps)");
}

TEST_F(ManifestTest, GroupsMustBeAnArrayOfTables) {
  EXPECT_EQ(error(std::string(kMinimal) + "\n[optimizer.groups]\nmatch = [\"*\"]\n"),
            at(7, 1) + "optimizer.groups must be an array of tables, not a table (write each entry as a "
                       "[[optimizer.groups]] table)");
}

TEST_F(ManifestTest, AGroupKeyInOptimizerPointsToTheGroups) {
  EXPECT_EQ(error(std::string(kMinimal) + "\n[optimizer]\nmatch = [\"*.bias\"]\n"),
            at(8, 1) + "unknown key 'match' in [optimizer] (it belongs in [[optimizer.groups]])");
}

TEST_F(ManifestTest, AdagradTakesTorchsEpsUnlessOneIsSet) {
  EXPECT_DOUBLE_EQ(load(kMinimal, {"optimizer.name=adagrad"}).optimizer.eps, 1e-10);
  EXPECT_DOUBLE_EQ(load(kMinimal, {"optimizer.name=adagrad", "optimizer.eps=1e-6"}).optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(load(kMinimal, {"optimizer.name=rmsprop"}).optimizer.eps, 1e-8);
}

}  // namespace
}  // namespace kiln
