// The run manifest: the TOML file a user hands to `kiln fit`. Parsing checks
// every host-owned key against the schema (config/manifest_schema.hpp:
// unknown keys get file:line:col and a suggestion, wrong types name the
// expected type) and resolves plugin paths relative to the manifest. Plugin
// tables pass through as TOML text for the plugin to read.
//
// The member initializers below are the keys' defaults; docs/manifest.md
// shows them.
//
// No LibTorch here: this header is included by the CLI and by tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/hparams.hpp"
#include "config/options.hpp"

namespace kiln {

// One plugin slot ([model], [data], or one [[callbacks]] entry).
struct PluginSpec {
  std::string slot;               // "model", "data", "callbacks[0]", ... (for messages)
  std::string path_text;          // `path` as written in the manifest
  std::filesystem::path path;     // resolved: relative to the manifest, or found on the plugin path
  std::string id;                 // `id`, optional: which descriptor of the .so ("" = the only one)
  std::string config_toml;        // the table minus host keys (`path`, `id`), as TOML text
  std::string where;              // "file:line:col" of the table, for messages
};

// A count or a fraction, like Lightning's limit_*_batches: an integer is a
// number of batches, a float in (0, 1] a fraction of the split.
// A count or "auto" (trainer.data_workers, trainer.prefetch_batches).
struct CountOrAuto {
  int64_t value = -1;  // -1 = auto
  bool is_auto() const { return value < 0; }
};

struct BatchLimit {
  bool is_fraction = true;
  double fraction = 1.0;
  int64_t count = 0;
  // Batches to run out of `available`.
  int64_t apply(int64_t available) const;
};

struct RunConfig {
  std::string name = "run";
  std::filesystem::path dir;  // run directory, resolved relative to the manifest; default <manifest dir>/runs/<name>
  uint64_t seed = 0;
  bool deterministic = false;
  int threads = 0;            // intra-op threads; 0 = all cores
  std::string device = "auto"; // "auto", "cpu", "cuda", "cuda:N"
  LogLevel log_level = LogLevel::info;
};

struct TrainerConfig {
  int64_t max_epochs = 10;          // -1 = unbounded (then max_steps must be set)
  int64_t max_steps = -1;           // -1 = unbounded
  int64_t batch_size = 32;
  int64_t eval_batch_size = 0;      // 0 = batch_size
  int64_t accumulate_grad_batches = 1;
  double gradient_clip_val = 0.0;   // 0 = off
  GradientClipAlgorithm gradient_clip_algorithm = GradientClipAlgorithm::norm;
  int64_t check_val_every_n_epoch = 1;           // 0 = never
  BatchLimit limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches;
  int64_t fast_dev_run = 0;         // N > 0: N batches of train/val/test, 1 epoch, no checkpoints
  bool shuffle = true;
  bool drop_last = false;
  CountOrAuto data_workers;         // threads calling get_batch; 0 = inline (data/data_workers.hpp)
  CountOrAuto prefetch_batches;     // batches in flight; auto = twice the workers, at least 4
  int64_t log_every_n_steps = 50;
  ProgressMode progress = ProgressMode::automatic;
  bool test_after_fit = false;      // run the test split at the end of `kiln fit`
  Precision precision = Precision::fp32;
  // bf16-true: the optimizer steps float32 copies of the trained weights
  // (true), or the bfloat16 weights themselves, its state bfloat16 too, as
  // Lightning's bf16-true does (false).
  bool master_weights = true;
  std::string max_time;             // "" = no limit; else "[DD:]HH:MM:SS" (config/duration.hpp)
  // Validation inside an epoch: a fraction of the epoch's batches or a
  // number of batches; 1.0 = at the epoch's end only.
  BatchLimit val_check_interval;
  bool predictions_text = false;    // `kiln predict` also writes predictions.txt (uint8 rows as text)
  int64_t num_sanity_val_steps = 2; // validation batches before the first training step; -1 = all, 0 = off
  // Train and validate on the same first batches of the training split, in
  // order: a count, or a fraction of the split; 0 = off.
  BatchLimit overfit_batches{false, 0.0, 0};
  NonfiniteMode detect_nonfinite = NonfiniteMode::raise;
};

// bf16-true with master weights: the optimizer steps float32 copies of the
// trained weights (otherwise the weights themselves, in their own dtype).
inline bool steps_float32_masters(const TrainerConfig& trainer) {
  return trainer.precision == Precision::bf16_true && trainer.master_weights;
}

// One [[optimizer.groups]] entry: the parameters its glob patterns match
// (the first group that matches a parameter takes it), and the options it
// sets in place of [optimizer]'s; an option it leaves out is [optimizer]'s.
struct OptimizerGroupConfig {
  std::vector<std::string> match;   // glob patterns over the model's parameter names
  std::string where;                // "file:line:col" of `match` (or "--set ..."), for messages
  std::optional<double> lr, weight_decay, momentum, eps, alpha, lr_decay, initial_accumulator_value;
  std::optional<bool> nesterov, centered;
  std::optional<std::pair<double, double>> betas;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::adam;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;            // sgd, rmsprop
  bool nesterov = false;            // sgd
  double beta1 = 0.9, beta2 = 0.999;// adam, adamw (`betas = [b1, b2]` in TOML)
  double eps = 1e-8;                // adam, adamw, rmsprop; adagrad's default is 1e-10 (torch's)
  double alpha = 0.99;              // rmsprop: the smoothing constant
  bool centered = false;            // rmsprop: normalize by the gradient's estimated variance
  double lr_decay = 0.0;            // adagrad
  double initial_accumulator_value = 0.0;  // adagrad
  bool fused = false;               // adam, adamw: optim/fused_adam.hpp
  std::vector<OptimizerGroupConfig> groups;  // [[optimizer.groups]], in manifest order

  // The options of `group`: its own where it sets them, these elsewhere
  // (the result has no groups).
  OptimizerConfig for_group(const OptimizerGroupConfig& group) const;
};

struct SchedulerConfig {
  SchedulerName name = SchedulerName::none;
  SchedulerInterval interval = SchedulerInterval::epoch;  // when the scheduler advances
  int64_t step_size = 10;           // step: periods between decays
  double gamma = 0.1;               // step: decay factor
  int64_t t_max = 0;                // cosine: periods to reach eta_min; 0 = whole run
  double eta_min = 0.0;             // cosine
  int64_t warmup_steps = 0;         // linear_warmup: periods of linear ramp from warmup_start_factor
  double warmup_start_factor = 0.0; // linear_warmup
};

// Checkpoints: written when the table is present (docs/checkpoints.md).
struct CheckpointConfig {
  std::filesystem::path dir;        // default <run dir>/checkpoints
  int64_t every_n_epochs = 1;
  int64_t every_n_steps = 0;
  std::string monitor;              // "" = none
  MonitorMode mode = MonitorMode::min;
  int64_t save_top_k = 1;
  bool save_last = true;
  bool enabled = false;
  // The signal that means "preempted: checkpoint now and exit 75" (SLURM and
  // most schedulers send SIGTERM first). none: it interrupts like SIGINT.
  PreemptSignal preempt_signal = PreemptSignal::sigterm;
  // Written on a background thread from a host-memory snapshot
  // (ckpt/checkpointer.hpp); the snapshot is taken either way. Off by
  // default: on 2 CPU cores it stalls the loop 20-60x less but costs more
  // steps than it saves (bench/README.md).
  bool async = false;
};

struct DistributedConfig {
  int64_t processes = 1;
  DistributedBackend backend = DistributedBackend::automatic;
  IntraHost intra_host = IntraHost::automatic;  // CPU gradients between ranks of one host
  GradientCompression gradient_compression = GradientCompression::none;
  ShardMode shard = ShardMode::none;  // optim/sharded_step.hpp
  double bucket_mb = 25.0;          // shard = "parameters": what is gathered at once (optim/sharded_parameters.hpp)
  bool prefetch = true;             // shard = "parameters": the next bucket gathered while this one computes
  double timeout_s = 60.0;          // every collective
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;          // 0 = pick a free one
  int64_t max_restarts = 0;         // kiln fit under kiln's own launch (distributed/restarts.hpp)
};

// Where metrics go (docs/logging.md): any of "csv", "jsonl", "tensorboard".
// [logging.mlflow]: the MLflow tracking server the "mlflow" logger sends to
// (docs/logging.md). Credentials never appear here: MLflow's own
// environment variables carry them.
struct MlflowConfig {
  std::string tracking_uri;  // "": MLFLOW_TRACKING_URI
  std::string experiment = "kiln";
  std::string run_name;      // "": run.name
  std::map<std::string, std::string> tags;
  bool required = true;      // false: a server that cannot be reached at start is a warning
  double finish_timeout_s = 30.0;
};

struct LoggingConfig {
  std::vector<std::string> loggers{"csv"};
  MlflowConfig mlflow;
};

// Whole-split metrics (docs/metrics.md).
struct MetricsConfig {
  int64_t collect_limit_mib = 0;  // 0: an eighth of the machine's memory
};

// [profiler] (docs/profiling.md).
struct ProfilerConfig {
  ProfilerKind kind = ProfilerKind::none;
};

// [averaging]: EMA or SWA weights beside the trained ones (docs/training.md).
struct AveragingConfig {
  AveragingKind kind = AveragingKind::none;
  double decay = 0.999;          // ema: avg = decay * avg + (1 - decay) * w
  int64_t start_step = 0;        // ema: updated from this optimizer step on (a copy of the weights before)
  BatchLimit start_epoch{true, 0.8, 0};  // swa: an epoch, or a fraction of max_epochs (Lightning's 0.8)
  double swa_lr = 0.0;           // swa: the learning rate from start_epoch on; 0 = the schedule's
  int64_t annealing_epochs = 0;  // swa: epochs of cosine annealing to swa_lr; 0 = at once
};

// SWA's first averaged epoch: start_epoch, or its fraction of max_epochs
// (truncated, as Lightning's int(0.8 * max_epochs)).
int64_t swa_start_epoch(const AveragingConfig& averaging, int64_t max_epochs);

struct Manifest {
  std::filesystem::path file;       // the manifest itself (absolute)
  std::string text;                 // the manifest as read, with overrides applied (for checkpoints)
  // The same flattened to dotted keys, for the loggers that record a run's
  // hyperparameters (config/hparams.hpp): parsed once, here.
  std::vector<HParam> hparams;
  RunConfig run;
  PluginSpec model;
  PluginSpec data;
  std::vector<PluginSpec> callbacks;
  TrainerConfig trainer;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  CheckpointConfig checkpoint;
  DistributedConfig distributed;
  LoggingConfig logging;
  MetricsConfig metrics;
  ProfilerConfig profiler;
  AveragingConfig averaging;
};

// Where bare plugin names (`path = "kiln_mlp"`) are looked up, in order.
struct PluginSearchPath {
  std::vector<std::filesystem::path> dirs;
  // KILN_PLUGIN_PATH (colon-separated), then <dir of the kiln executable>/../lib/kiln/plugins.
  static PluginSearchPath from_environment();
};

// Reads and validates a manifest. `overrides` are "dotted.key=value" strings
// from --set; the value is parsed as a TOML value, or taken as a string if it
// does not parse (so `--set run.name=exp1` works). Throws InputError with one
// line naming the file (and line:col where there is one) on any problem.
Manifest load_manifest(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                       const PluginSearchPath& search);

}  // namespace kiln
