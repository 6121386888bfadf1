// Every host key of the manifest, declared once. A key's type follows the
// Manifest member it fills (bool, integer, double, string, path, an enum of
// config/options.hpp, BatchLimit); its default is that member's initializer.
// Keys are listed in the order "known keys" messages and docs/manifest.md
// show them.
//
// Long on purpose: it is a table, one declaration per key with the line of
// documentation docs/manifest.md shows, in one function per manifest table.
// How a declaration is made is in config/schema_declaration.hpp.
#include "config/manifest_schema.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "config/duration.hpp"
#include "config/schema_declaration.hpp"
#include "config/text.hpp"
#include "kiln/detail/suggest.hpp"
#include "config/logger_registry.hpp"
#include "util/shortest_double.hpp"

namespace kiln {

namespace {

using manifest_detail::TableDeclaration;

// run.name names a directory under runs/.
std::string refuse_run_name(const std::string& name, const std::string& v) {
  const bool control =
      std::any_of(v.begin(), v.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  if (!control && v.find('/') == std::string::npos && v != "." && v != "..") return "";
  return name + " must be a plain name, not '" + v +
         "' (it names the run's directory under runs/; use run.dir to choose another directory)";
}

// run.device: auto, cpu, cuda or cuda:N — open-ended, so a string, not a closed set.
std::string refuse_device(const std::string& name, const std::string& v) {
  auto valid = [](const std::string& d) {
    return d == "auto" || d == "cpu" || d == "cuda" ||
           (d.rfind("cuda:", 0) == 0 && d.size() <= 9 && manifest_detail::all_digits(d.substr(5)));
  };
  if (valid(v)) return "";
  std::string folded = manifest_detail::lower(v);
  if (folded.rfind("gpu", 0) == 0) folded = "cuda" + folded.substr(3);
  const std::string hint =
      valid(folded) ? detail::did_you_mean_hint(folded) : detail::did_you_mean(v, {"auto", "cpu", "cuda"});
  return name + " must be 'auto', 'cpu', 'cuda' or 'cuda:N' (N = device index), not '" + v + "'" + hint;
}

// trainer.max_time: Lightning's "DD:HH:MM:SS", or "HH:MM:SS".
std::string refuse_max_time(const std::string& name, const std::string& v) {
  if (v.empty() || parse_duration_seconds(v)) return "";
  return name + " must be a duration \"HH:MM:SS\" or \"DD:HH:MM:SS\" (e.g. \"00:30:00\" for 30 minutes), not '" + v +
         "'";
}

TableSchema declare_run_table() {
  TableDeclaration<RunConfig> run("run", &Manifest::run, "The run: its name, directory, seed and device");
  run.key("name", &RunConfig::name, "names the run's directory, `runs/<name>` next to the manifest")
      .nonempty()
      .refuse(refuse_run_name, "a plain name: no `/`, not `.` or `..`");
  run.key("dir", &RunConfig::dir, "the run directory (metrics.csv, checkpoints), relative to the manifest")
      .nonempty()
      .default_text("`runs/<run.name>` next to the manifest");
  run.key("seed", &RunConfig::seed, "seeds the host's generator: sampling order and plugin randomness").at_least(0);
  run.key("deterministic", &RunConfig::deterministic, "asks LibTorch for deterministic algorithms");
  run.key("threads", &RunConfig::threads, "intra-op threads of the training step; 0 = all cores").between(0, 4096);
  run.key("device", &RunConfig::device,
          "where the model and batches live; `auto`: CUDA when a device is visible; with several processes on a "
          "node, `cuda` and `auto` give each rank `cuda:LOCAL_RANK`")
      .refuse(refuse_device, "`auto`, `cpu`, `cuda`, `cuda:N`");
  run.key("log_level", &RunConfig::log_level, "the host's log level");
  return run.done();
}

// [trainer]'s loop: its length, its batches, clipping, validation and limits.
void declare_trainer_loop_keys(TableDeclaration<TrainerConfig>& trainer) {
  trainer.key("max_epochs", &TrainerConfig::max_epochs, "epochs to train; -1 = no limit (then set max_steps)")
      .at_least(-1);
  trainer.key("max_steps", &TrainerConfig::max_steps, "optimizer steps to train; -1 = no limit").at_least(-1);
  trainer.key("batch_size", &TrainerConfig::batch_size, "samples per training batch").at_least(1);
  trainer.key("eval_batch_size", &TrainerConfig::eval_batch_size,
              "samples per validation, test and predict batch; 0 = batch_size")
      .at_least(0);
  trainer.key("accumulate_grad_batches", &TrainerConfig::accumulate_grad_batches,
              "batches whose gradients add up to one optimizer step")
      .at_least(1);
  trainer.key("gradient_clip_val", &TrainerConfig::gradient_clip_val, "gradient clipping threshold; 0 = off")
      .at_least(0.0);
  trainer.key("gradient_clip_algorithm", &TrainerConfig::gradient_clip_algorithm,
              "clip the gradients' total norm, or each value");
  trainer.key("check_val_every_n_epoch", &TrainerConfig::check_val_every_n_epoch,
              "validate every N epochs; 0 = never")
      .at_least(0);
  trainer.key("limit_train_batches", &TrainerConfig::limit_train_batches,
              "training batches per epoch: a count, or a fraction of the split");
  trainer.key("limit_val_batches", &TrainerConfig::limit_val_batches,
              "validation batches: a count, or a fraction of the split");
  trainer.key("limit_test_batches", &TrainerConfig::limit_test_batches,
              "test batches: a count, or a fraction of the split");
  trainer.key("limit_predict_batches", &TrainerConfig::limit_predict_batches,
              "predict batches: a count, or a fraction of the split");
  trainer.key("fast_dev_run", &TrainerConfig::fast_dev_run,
              "N > 0 (true = 1): N batches of train, val and test, one epoch, no checkpoints")
      .kind(ValueKind::flag_or_count);
  trainer.key("num_sanity_val_steps", &TrainerConfig::num_sanity_val_steps,
              "validation batches each rank runs before the first training step of a fresh fit (not on resume), "
              "logging nothing, so a bug in validation_step shows in seconds; -1 = the whole split, 0 = off")
      .at_least(-1);
  trainer.key("overfit_batches", &TrainerConfig::overfit_batches,
              "train and validate on the same first batches of the training split, unshuffled (a count, or a "
              "fraction of the split): can the model memorise them? 0 = off");
  trainer.key("detect_nonfinite", &TrainerConfig::detect_nonfinite,
              "a NaN/inf training loss or gradient norm, found at the log points without a per-step read-back: "
              "`raise` ends the run naming the steps (no checkpoint of non-finite weights is committed), `warn` "
              "says so and trains on, `off` does not look");
}

// [trainer]'s data loading, progress, precision, time limit and output.
void declare_trainer_output_keys(TableDeclaration<TrainerConfig>& trainer) {
  trainer.key("shuffle", &TrainerConfig::shuffle, "a new sample order each epoch (from run.seed and the epoch)");
  trainer.key("drop_last", &TrainerConfig::drop_last, "drop the last training batch when it is short");
  trainer.key("data_workers", &TrainerConfig::data_workers,
              "host threads calling the data module's get_batch, batches reaching the step in sampler order; 0: "
              "inline on the main thread just before each step. `auto` (one log line says what it chose and why): "
              "one thread for a data module that does not declare concurrent get_batch; on a GPU one per core of "
              "the rank's share but one, at most 8; on the CPU the cores the intra-op threads leave over, at most "
              "8, none left: inline, and in one process a trial early in epoch 0 times inline against them and "
              "keeps the faster (docs/data.md)")
      .between(0, 1024);
  trainer.key("prefetch_batches", &TrainerConfig::prefetch_batches,
              "batches in flight ahead of the step (a bounded queue: the memory of the batches the workers hold); "
              "`auto`: twice the workers, at least 4")
      .between(1, 65536);
  trainer.key("log_every_n_steps", &TrainerConfig::log_every_n_steps, "progress lines, and the loggers' step rows (docs/logging.md), every N optimizer steps")
      .at_least(1);
  trainer.key("progress", &TrainerConfig::progress, "auto: a bar on a terminal, lines elsewhere");
  trainer.key("test_after_fit", &TrainerConfig::test_after_fit, "run the test split at the end of `kiln fit`");
  trainer.key("precision", &TrainerConfig::precision,
              "`32`: float32; `bf16-mixed`: the model's steps under bfloat16 autocast (CPU or CUDA); `16-mixed`: "
              "float16 autocast with a gradient scaler (CUDA only; the scale is saved in checkpoints); `bf16-true`: "
              "the model's weights, gradients and activations in bfloat16, the optimizer stepping float32 copies of "
              "the trained weights (docs/training.md, \"Precision\")");
  trainer.key("master_weights", &TrainerConfig::master_weights,
              "with precision `bf16-true`: `true`: the optimizer steps float32 copies of the trained weights, its "
              "state float32 (Adam: 20 bytes a trained value replicated); `false` (adam and adamw): it steps the "
              "bfloat16 weights themselves, its state bfloat16, as Lightning's bf16-true (8 bytes a value; an "
              "update under half a weight's bfloat16 spacing is lost) (docs/training.md, \"Precision\")");
  trainer.key("max_time", &TrainerConfig::max_time,
              "a time limit for the fit, `HH:MM:SS` or `DD:HH:MM:SS` (Lightning's form); \"\" = none. It stops at "
              "a step boundary all ranks agree on, with a checkpoint when checkpoints are on; a resumed run gets the "
              "limit anew")
      .refuse(refuse_max_time, "`\"\"`, `\"HH:MM:SS\"`, `\"DD:HH:MM:SS\"`");
  trainer.key("val_check_interval", &TrainerConfig::val_check_interval,
              "validation inside the epoch: a fraction of its batches (0.25 = four times an epoch) or a number "
              "of training batches; 1.0 = at the epoch's end only (validating epochs follow check_val_every_n_epoch)")
      .allowed("an integer >= 1 (batches) or a float in (0.0, 1.0] (a fraction)");
  trainer.key("predictions_text", &TrainerConfig::predictions_text,
              "`kiln predict` also writes predictions.txt: each row of uint8 outputs (bytes) as text, under a "
              "`--- row N ---` line");
}

TableSchema declare_trainer_table() {
  TableDeclaration<TrainerConfig> trainer("trainer", &Manifest::trainer, "The loop: epochs, batches, clipping, output");
  declare_trainer_loop_keys(trainer);
  declare_trainer_output_keys(trainer);
  return trainer.done();
}

TableSchema declare_optimizer_table() {
  TableDeclaration<OptimizerConfig> optimizer("optimizer", &Manifest::optimizer,
                                              "The optimizer (built by runtime/optim/optim_registry.cpp)");
  optimizer.key("name", &OptimizerConfig::name, "which optimizer");
  optimizer.key("lr", &OptimizerConfig::lr, "the base learning rate").above(0.0);
  optimizer.key("weight_decay", &OptimizerConfig::weight_decay, "L2 penalty (decoupled for adamw)").at_least(0.0);
  optimizer.key("momentum", &OptimizerConfig::momentum, "sgd and rmsprop: the momentum factor").at_least(0.0);
  optimizer.key("nesterov", &OptimizerConfig::nesterov, "sgd only: Nesterov momentum (needs momentum > 0)");
  optimizer.key(
      "betas", ValueKind::betas,
      [](Manifest& m, const SchemaValue& v) {
        std::tie(m.optimizer.beta1, m.optimizer.beta2) = std::get<std::pair<double, double>>(v);
      },
      [](const Manifest& m) { return "[" + float_text(m.optimizer.beta1) + ", " + float_text(m.optimizer.beta2) + "]"; },
      "adam and adamw: the running averages' coefficients [beta1, beta2]");
  optimizer.key("eps", &OptimizerConfig::eps, "adam, adamw, rmsprop, adagrad: added to the denominator")
      .above(0.0)
      .default_text("`1e-08`; adagrad: `1e-10` (torch's defaults)");
  optimizer.key("alpha", &OptimizerConfig::alpha, "rmsprop: the smoothing constant of the squared gradients' average")
      .between(0.0, 1.0);
  optimizer.key("centered", &OptimizerConfig::centered,
                "rmsprop: divide by the gradient's estimated variance rather than its second moment");
  optimizer.key("lr_decay", &OptimizerConfig::lr_decay, "adagrad: the rate is lr / (1 + (step - 1) * lr_decay)")
      .at_least(0.0);
  optimizer.key("initial_accumulator_value", &OptimizerConfig::initial_accumulator_value,
                "adagrad: the starting value of the squared gradients' sum")
      .at_least(0.0);
  optimizer.key("fused", &OptimizerConfig::fused,
                "adam and adamw: each step in one pass over a parameter's elements (as torch's fused=True on the "
                "CPU); the same state and checkpoints, within float32 rounding of the unfused step");
  return optimizer.done();
}

// Each [[optimizer.groups]] entry: its keys bound to the newest group.
TableSchema declare_optimizer_groups_table() {
  static const OptimizerGroupConfig kNoGroup;
  TableDeclaration<OptimizerGroupConfig> groups(
      "optimizer.groups", [](Manifest& m) -> OptimizerGroupConfig& { return m.optimizer.groups.back(); },
      [](const Manifest&) -> const OptimizerGroupConfig& { return kNoGroup; },
      "Parameter groups: options for the parameters whose names match; the first group that matches a parameter "
      "takes it, and the parameters no group matches keep [optimizer]'s options (docs/optimizer_groups.md)");
  groups.array_of_tables([](Manifest& m, const std::string& where) {
    m.optimizer.groups.emplace_back();
    m.optimizer.groups.back().where = where;
  });
  const std::string inherited = "[optimizer]'s";
  groups.key("match", &OptimizerGroupConfig::match,
             "glob patterns over the parameter names the model reports (`*` any run of characters, dots "
             "included; `?` one; `[abc]` one of); each must match a parameter")
      .required();
  groups.key("lr", &OptimizerGroupConfig::lr, "the group's base learning rate (a schedule scales it)")
      .above(0.0)
      .default_text(inherited);
  groups.key("weight_decay", &OptimizerGroupConfig::weight_decay, "the group's weight decay")
      .at_least(0.0)
      .default_text(inherited);
  groups.key("momentum", &OptimizerGroupConfig::momentum, "sgd, rmsprop").at_least(0.0).default_text(inherited);
  groups.key("nesterov", &OptimizerGroupConfig::nesterov, "sgd").default_text(inherited);
  groups.key("betas", &OptimizerGroupConfig::betas, "adam, adamw").default_text(inherited);
  groups.key("eps", &OptimizerGroupConfig::eps, "adam, adamw, rmsprop, adagrad").above(0.0).default_text(inherited);
  groups.key("alpha", &OptimizerGroupConfig::alpha, "rmsprop").between(0.0, 1.0).default_text(inherited);
  groups.key("centered", &OptimizerGroupConfig::centered, "rmsprop").default_text(inherited);
  groups.key("lr_decay", &OptimizerGroupConfig::lr_decay, "adagrad").at_least(0.0).default_text(inherited);
  groups.key("initial_accumulator_value", &OptimizerGroupConfig::initial_accumulator_value, "adagrad")
      .at_least(0.0)
      .default_text(inherited);
  return groups.done();
}

TableSchema declare_scheduler_table() {
  TableDeclaration<SchedulerConfig> scheduler("scheduler", &Manifest::scheduler,
                                              "The learning-rate schedule: the rate of each period (an epoch or a step)");
  scheduler.key("name", &SchedulerConfig::name, "which schedule; none keeps optimizer.lr");
  scheduler.key("interval", &SchedulerConfig::interval, "the period: the schedule advances every epoch or every step");
  scheduler.key("step_size", &SchedulerConfig::step_size, "step: periods between decays").at_least(1);
  scheduler.key("gamma", &SchedulerConfig::gamma, "step: the decay factor").above(0.0);
  scheduler.key("t_max", &SchedulerConfig::t_max, "cosine: periods to reach eta_min; 0 = the whole run")
      .at_least(0);
  scheduler.key("eta_min", &SchedulerConfig::eta_min, "cosine: the final learning rate").at_least(0.0);
  scheduler.key("warmup_steps", &SchedulerConfig::warmup_steps,
                "linear_warmup: periods of linear ramp up to optimizer.lr")
      .at_least(0);
  scheduler.key("warmup_start_factor", &SchedulerConfig::warmup_start_factor,
                "linear_warmup: the ramp's first factor on optimizer.lr")
      .between(0.0, 1.0);
  return scheduler.done();
}

TableSchema declare_checkpoint_table() {
  TableDeclaration<CheckpointConfig> checkpoint("checkpoint", &Manifest::checkpoint,
                                                "Checkpoints, written when this table is present (docs/checkpoints.md)");
  checkpoint.key("dir", &CheckpointConfig::dir, "where checkpoints go, relative to the manifest")
      .nonempty()
      .default_text("`<run.dir>/checkpoints`");
  checkpoint.key("every_n_epochs", &CheckpointConfig::every_n_epochs, "a checkpoint every N epochs; 0 = none")
      .at_least(0);
  checkpoint.key("every_n_steps", &CheckpointConfig::every_n_steps, "a checkpoint every N optimizer steps; 0 = none")
      .at_least(0);
  checkpoint.key("monitor", &CheckpointConfig::monitor, "the metric ranking checkpoints; \"\" = none (newest first)");
  checkpoint.key("mode", &CheckpointConfig::mode, "whether a lower or a higher monitor value is better");
  checkpoint.key("save_top_k", &CheckpointConfig::save_top_k, "ranked checkpoints kept; -1 = all, 0 = only last.ckpt")
      .at_least(-1);
  checkpoint.key("save_last", &CheckpointConfig::save_last, "keep last.ckpt, the newest checkpoint");
  checkpoint.key("enabled", &CheckpointConfig::enabled, "false turns checkpoints off with the table in place")
      .default_text("true when [checkpoint] is present");
  checkpoint.key("preempt_signal", &CheckpointConfig::preempt_signal,
                 "the signal that means preempted: checkpoint, then exit 75; none: it interrupts");
  checkpoint.key("async", &CheckpointConfig::async,
                 "write each checkpoint on a background thread from a snapshot in host memory while training goes on "
                 "(one in flight; keeps a state-sized buffer; docs/checkpoints.md); false: training waits for the write");
  return checkpoint.done();
}

TableSchema declare_distributed_table() {
  TableDeclaration<DistributedConfig> distributed("distributed", &Manifest::distributed,
                                                  "Several processes (docs/distributed.md)");
  distributed.key("processes", &DistributedConfig::processes, "worker processes kiln starts on this machine")
      .at_least(1);
  distributed.key("backend", &DistributedConfig::backend, "the process group; auto: nccl on CUDA, gloo on CPU");
  distributed.key("intra_host", &DistributedConfig::intra_host,
                  "CPU gradients between ranks of one host: shm = a shared-memory all-reduce, gloo = loopback TCP; "
                  "auto: shm when every rank can map the segment");
  distributed.key("gradient_compression", &DistributedConfig::gradient_compression,
                  "the dtype gradients are all-reduced in (weights and optimizer stay float32)");
  distributed.key("shard", &DistributedConfig::shard,
                  "what each rank holds of the training state: none = everything (replicated, as DDP); optimizer = "
                  "its 1/N of the optimizer's state, gradients reduce-scattered (ZeRO-1: Adam's moments on 1/N of "
                  "the parameters each); gradients = also only its 1/N of the reduced gradients, every whole "
                  "gradient dropped once reduced (ZeRO-2); parameters = also only its 1/N of every parameter, "
                  "frozen ones too, each gathered whole while an operator reads it (ZeRO-3, FSDP's FULL_SHARD); "
                  "docs/distributed.md");
  distributed.key("bucket_mb", &DistributedConfig::bucket_mb,
                  "shard = \"parameters\": the megabytes of consecutive parameters gathered at once; at most two "
                  "such buckets stay whole beyond what the running operator reads and the one fetched ahead")
      .above(0.0);
  distributed.key("prefetch", &DistributedConfig::prefetch,
                  "shard = \"parameters\": gather the bucket the last pass of its kind read next while the "
                  "operators on this one compute (false: each bucket when an operator first reads it)");
  distributed.key("timeout_s", &DistributedConfig::timeout_s, "seconds every collective and the rendezvous may take")
      .above(0.0);
  distributed.key("master_addr", &DistributedConfig::master_addr, "the rendezvous address kiln's workers use")
      .nonempty();
  distributed.key("master_port", &DistributedConfig::master_port, "the rendezvous port; 0 = a free one")
      .between(0, 65535);
  distributed.key("max_restarts", &DistributedConfig::max_restarts,
                  "kiln fit: after a worker fails, start the workers again this many times at most, from the newest "
                  "committed checkpoint (--max-restarts; never after bad input, a start-up disagreement, a "
                  "preemption or a restart that committed nothing)")
      .at_least(0);
  return distributed.done();
}

TableSchema declare_logging_table() {
  TableDeclaration<LoggingConfig> logging("logging", &Manifest::logging,
                                          "Where metrics are written, on rank 0 (docs/logging.md)");
  logging.key("loggers", &LoggingConfig::loggers,
              "metrics.csv (epoch rows), metrics.jsonl and TensorBoard's events.out.tfevents.kiln (step and epoch "
              "rows), in the run directory; [] = none")
      .choices(logger_names());
  return logging.done();
}

// logging.mlflow.tracking_uri: an http(s) server, without credentials in it
// (the manifest is copied into every checkpoint).
std::string refuse_tracking_uri(const std::string& name, const std::string& v) {
  if (v.empty()) return "";
  const size_t scheme_end = v.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : manifest_detail::lower(v.substr(0, scheme_end));
  if (scheme != "http" && scheme != "https")
    return name + " must be an http:// or https:// address of an MLflow tracking server (e.g. "
                  "\"http://127.0.0.1:5000\"), not '" + v + "'";
  const std::string rest = v.substr(scheme_end + 3);
  const std::string authority = rest.substr(0, rest.find('/'));
  if (authority.find('@') != std::string::npos)
    return name + " must not hold a user name or password (it is copied into every checkpoint): set "
                  "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, instead";
  if (authority.empty()) return name + " names no host: '" + v + "'";
  return "";
}

TableSchema declare_logging_mlflow_table() {
  TableDeclaration<MlflowConfig> mlflow(
      "logging.mlflow", [](Manifest& m) -> MlflowConfig& { return m.logging.mlflow; },
      [](const Manifest& m) -> const MlflowConfig& { return m.logging.mlflow; },
      "The MLflow tracking server the `mlflow` logger sends params, metrics and the run's end to, from rank 0 "
      "(docs/logging.md); credentials come from MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD");
  mlflow.key("tracking_uri", &MlflowConfig::tracking_uri, "the server's address, e.g. `http://127.0.0.1:5000`")
      .refuse(refuse_tracking_uri, "an http:// or https:// address, without user or password")
      .default_text("MLFLOW_TRACKING_URI");
  mlflow.key("experiment", &MlflowConfig::experiment, "the experiment the run belongs to; created when absent")
      .nonempty();
  mlflow.key("run_name", &MlflowConfig::run_name, "the MLflow run's name").default_text("the run directory's name");
  mlflow.key("tags", &MlflowConfig::tags, "the run's tags, e.g. `{ team = \"vision\" }` (kiln adds kiln.run_dir and, at "
                                          "the end, kiln.final_checkpoint)");
  mlflow.key("required", &MlflowConfig::required,
             "a server that cannot be reached or refuses the login at start ends the run (exit 2); false: a "
             "warning, and the points wait in the run directory's spool for `kiln mlflow-sync`");
  mlflow.key("finish_timeout_s", &MlflowConfig::finish_timeout_s,
             "at the run's end, how long to wait for the server to take the points still queued")
      .at_least(0.0);
  return mlflow.done();
}

TableSchema declare_metrics_table() {
  TableDeclaration<MetricsConfig> metrics("metrics", &Manifest::metrics,
                                          "Metrics over a whole split from collected rows (docs/metrics.md)");
  metrics.key("collect_limit_mib", &MetricsConfig::collect_limit_mib,
              "the most a split's collected rows may take over all ranks, in MiB (every rank holds all of them at "
              "the epoch's end); 0 = an eighth of the machine's memory")
      .at_least(0);
  return metrics.done();
}

TableSchema declare_profiler_table() {
  TableDeclaration<ProfilerConfig> profiler("profiler", &Manifest::profiler,
                                            "Where the fit's time goes, per phase (docs/profiling.md)");
  profiler.key("kind", &ProfilerConfig::kind,
               "`simple`: a table per phase at the fit's end (the slowest rank's, with the spread over ranks); "
               "`trace`: also a Chrome trace-event file per rank, trace.rank<N>.json in the run directory "
               "(Perfetto, chrome://tracing); `none`: off");
  return profiler.done();
}

TableSchema declare_averaging_table() {
  TableDeclaration<AveragingConfig> averaging(
      "averaging", &Manifest::averaging,
      "Averaged weights kept beside the trained ones, used for validation, test, predict and export "
      "(docs/training.md)");
  averaging.key("kind", &AveragingConfig::kind,
                "`ema`: an exponential moving average, updated after each optimizer step; `swa`: stochastic weight "
                "averaging, the mean of the weights at each epoch's end from start_epoch on; `none`: off");
  averaging.key("decay", &AveragingConfig::decay, "ema: average = decay * average + (1 - decay) * weights")
      .allowed("a float in (0.0, 1.0)");
  averaging.key("start_step", &AveragingConfig::start_step,
                "ema: the optimizer step from which the average is updated; before it, it is the weights")
      .at_least(0);
  averaging.key("start_epoch", &AveragingConfig::start_epoch,
                "swa: the first epoch whose end is averaged, an epoch number (integer) or a fraction of "
                "trainer.max_epochs (float)")
      .allowed("an integer >= 0 (an epoch) or a float in [0.0, 1.0] (a fraction of max_epochs)")
      .counts("an epoch number");
  averaging.key("swa_lr", &AveragingConfig::swa_lr,
                "swa: the learning rate from start_epoch on (every parameter group); 0 = the schedule's")
      .at_least(0.0);
  averaging.key("annealing_epochs", &AveragingConfig::annealing_epochs,
                "swa: epochs of cosine annealing from the scheduled rate to swa_lr; 0 = swa_lr at once")
      .at_least(0);
  return averaging.done();
}

// In the order of the reference: an array of tables right after the table
// that holds it.
std::vector<TableSchema> declare_schema() {
  return {declare_run_table(),       declare_trainer_table(),    declare_optimizer_table(),
          declare_optimizer_groups_table(), declare_scheduler_table(), declare_checkpoint_table(),
          declare_distributed_table(), declare_logging_table(), declare_logging_mlflow_table(), declare_metrics_table(),
          declare_profiler_table(),  declare_averaging_table()};
}

std::vector<KeySchema> declare_plugin_host_keys() {
  KeySchema path;
  path.key = "path";
  path.kind = ValueKind::string;
  path.nonempty = true;
  path.allowed_text = "a plugin name (looked up on KILN_PLUGIN_PATH) or a path to a .so";
  path.default_text = "required";
  path.doc = "the plugin: a bare name is looked up; a path is relative to the manifest";
  KeySchema id;
  id.key = "id";
  id.kind = ValueKind::string;
  id.default_text = "`\"\"`";
  id.doc = "which descriptor of the .so; \"\" = its only one";
  return {path, id};
}

}  // namespace

const std::vector<TableSchema>& manifest_schema() {
  static const std::vector<TableSchema> schema = declare_schema();
  return schema;
}

const std::vector<KeySchema>& plugin_host_keys() {
  static const std::vector<KeySchema> keys = declare_plugin_host_keys();
  return keys;
}

}  // namespace kiln
