#include "train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "ckpt/checkpointer.hpp"
#include "config/duration.hpp"
#include "ckpt/run_state.hpp"
#include "distributed/agreement.hpp"
#include "device/batch_mover.hpp"
#include "distributed/grad_sync.hpp"
#include "distributed/heartbeat.hpp"
#include "distributed/process_group.hpp"
#include "metrics/loggers.hpp"
#include "metrics/metric_store.hpp"
#include "metrics/tensor_metrics.hpp"
#include "plugin/plugin_instance.hpp"
#include "plugin/proxies.hpp"
#include "train/optim.hpp"
#include "train/loops/evaluation_loop.hpp"
#include "train/loops/fit_loop.hpp"
#include "train/loops/predict_loop.hpp"
#include "train/loops/stop_condition.hpp"
#include "train/model_parameters.hpp"
#include "train/monitors.hpp"
#include "train/precision.hpp"
#include "train/prediction_text.hpp"
#include "train/progress.hpp"
#include "train/sampled_batches.hpp"
#include "train/sampler.hpp"
#include "util/durable_file.hpp"
#include "util/errors.hpp"
#include "util/process_info.hpp"
#include "util/run_dir_lock.hpp"

namespace kiln {

const char* command_name(Command command) {
  switch (command) {
    case Command::fit: return "fit";
    case Command::validate: return "validate";
    case Command::test: return "test";
    case Command::predict: return "predict";
  }
  return "?";
}

RunPlugins load_plugins(const Manifest& manifest, Command command, Loader& loader) {
  const std::string file = manifest.file.filename().string();
  auto load = [&](const PluginSpec& spec, kiln_plugin_kind kind) {
    return loader.load(spec.path, spec.id, kind, spec.slot, file + " [" + spec.slot + "]");
  };
  // Every plugin is loaded and checked before any is created.
  RunPlugins plugins{{}, load(manifest.data, KILN_KIND_DATA_MODULE), load(manifest.model, KILN_KIND_MODEL)};
  for (const auto& spec : manifest.callbacks) plugins.callbacks.push_back(load(spec, KILN_KIND_CALLBACK));

  std::vector<const LoadedPlugin*> all{&plugins.model, &plugins.data};
  for (const auto& c : plugins.callbacks) all.push_back(&c);
  check_unique_ids(all, file);

  const kiln_model_hooks& hooks = plugins.model.model_hooks();
  const std::string who = file + " [model] '" + plugins.model.id() + "'";
  if (command == Command::fit && !hooks.training_step)
    throw InputError(who + " implements no training_step; `kiln fit` needs one");
  if (command == Command::validate && !hooks.validation_step)
    throw InputError(who + " implements no validation_step; `kiln validate` needs one");
  if (command == Command::test && !hooks.test_step)
    throw InputError(who + " implements no test_step; `kiln test` needs one");
  if (command == Command::predict && !hooks.predict_step)
    throw InputError(who + " implements no predict_step; `kiln predict` needs one");
  return plugins;
}

namespace {

kiln_stage stage_of(Command command) {
  switch (command) {
    case Command::fit: return KILN_STAGE_FIT;
    case Command::validate: return KILN_STAGE_VALIDATE;
    case Command::test: return KILN_STAGE_TEST;
    case Command::predict: return KILN_STAGE_PREDICT;
  }
  return KILN_STAGE_FIT;
}

const char* signal_name(int s) { return s == SIGTERM ? "SIGTERM" : s == SIGUSR1 ? "SIGUSR1" : "SIGINT"; }

// How often ranks vote on stopping (a callback's request, a signal, a
// preemption) inside an epoch. Each vote is a collective round trip; voting
// every step cost mlp256 ~25 % of its 2-process epoch on this machine, and a
// stop acted on 16 steps later is still prompt (bench/README.md).
constexpr int64_t kAgreeEveryNSteps = 16;

// One run, wired: the process group, the plugins (through their proxies),
// the checkpointer and the metrics, handed to the loops (train/loops) as the
// parts they call. The plugins reach it through RunServices. The loops'
// events pass through it on their way to the callbacks, for the monitors.
class Run final : public RunServices, public RunControl, public MetricSink, public EventSink {
 public:
  Run(const Manifest& manifest, Command command, const std::atomic<int>* signal, const DistEnv* dist,
      const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat)
      : m_(manifest),
        heartbeat_(heartbeat),
        activity_(heartbeat ? heartbeat->activity() : nullptr),
        command_(command),
        signal_(signal),
        dist_(dist && dist->world_size > 1 ? dist : nullptr),
        device_(manifest.run.device),
        progress_(Progress::mode_from(manifest.trainer.progress), manifest.trainer.log_every_n_steps),
        loggers_(manifest.logging.loggers, manifest.run.dir) {
    const auto& t = m_.trainer;
    max_epochs_ = t.max_epochs;
    max_steps_ = t.max_steps;
    limit_train_ = t.limit_train_batches;
    limit_val_ = t.limit_val_batches;
    limit_test_ = t.limit_test_batches;
    if (t.fast_dev_run > 0) {
      // Lightning's fast_dev_run: N batches of each split, one epoch.
      max_epochs_ = 1;
      max_steps_ = -1;
      BatchLimit n;
      n.is_fraction = false;
      n.count = t.fast_dev_run;
      limit_train_ = limit_val_ = limit_test_ = n;
    }
    std::optional<int64_t> max_seconds;
    if (!t.max_time.empty() && t.fast_dev_run == 0) max_seconds = parse_duration_seconds(t.max_time);
    stop_.emplace(max_epochs_, max_steps_, dist_ ? kAgreeEveryNSteps : 1, max_seconds);
    // Lightning's fast_dev_run writes no checkpoints either.
    checkpointing_ = m_.checkpoint.enabled && command_ == Command::fit && t.fast_dev_run == 0;
    // Preempted means a checkpoint, then exit 75: only a run that writes
    // checkpoints can be; elsewhere the signal interrupts (exit 130).
    if (checkpointing_ && m_.checkpoint.preempt_signal != PreemptSignal::none)
      preempt_signal_ = m_.checkpoint.preempt_signal == PreemptSignal::sigusr1 ? SIGUSR1 : SIGTERM;
    if (resume) resume_ = *resume;
  }

  RunOutcome execute(RunPlugins plugins) {
    configure_torch();
    phase("rendezvous");
    if (dist_) {
      // The process group exists before any plugin: no plugin code can run
      // before every rank has arrived, or launch anything itself.
      // A signal ends any wait at once (a preemption notice excepted: it is
      // voted on at the next step boundary, where the checkpoint is taken).
      group_ = std::make_unique<ProcessGroup>(*dist_, m_.distributed, m_.run.device, [this]() -> std::string {
        const int s = signal_ ? signal_->load() : 0;
        if (s == 0 || (s == preempt_signal_ && command_ == Command::fit)) return "";
        return signal_name(s);
      });
      spdlog::info("rank {}/{} joined the process group ({} launch; gradients over {})", rank(), world_size(),
                   dist_->launcher, group_->gradient_transport());
    }
    checkpointer_.emplace(m_.checkpoint, rank(), [this](bool ok) {
      if (!group_) return ok;
      at::Tensor failed = at::tensor({ok ? 0.0 : 1.0}, at::kDouble);
      group_->all_reduce_sum(failed);
      return failed.item<double>() == 0;
    });

    std::vector<std::unique_ptr<PluginInstance>> callbacks;
    for (size_t i = 0; i < plugins.callbacks.size(); ++i)
      callbacks.push_back(std::make_unique<PluginInstance>(std::move(plugins.callbacks[i]),
                                                           m_.callbacks[i].config_toml, this));
    auto data = std::make_unique<PluginInstance>(std::move(plugins.data), m_.data.config_toml, this);
    auto model = std::make_unique<PluginInstance>(std::move(plugins.model), m_.model.config_toml, this);
    Session session(std::move(callbacks), std::move(data), std::move(model), rank());
    session_ = &session;

    // Seeded right before create, so model initialisation is reproducible.
    torch::manual_seed(m_.run.seed);
    phase("plugin set-up");
    RunOutcome outcome;
    const bool local_zero = !dist_ || dist_->local_rank == 0;
    outcome.failure = session.run(
        stage_of(command_), /*prepare_data=*/local_zero, [&] { if (group_) group_->barrier(); }, [&] { body(); });
    context_.reset();
    session_ = nullptr;
    outcome.metrics = metrics_.latest();
    outcome.calls_abandoned = session.data().calls_in_flight() > 0;
    return outcome;
  }

  // --- RunServices (the plugins' host table) ----------------------------------
  void record_metric(const std::string& plugin_id, const char* name, double value, double weight,
                     uint32_t flags) override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    try {
      metrics_.record(name, value, weight, flags);
    } catch (const std::exception& e) {
      spdlog::warn("[{}] {}", plugin_id, e.what());
    }
  }
  void record_metric_tensor(const std::string& plugin_id, const char* name, const at::Tensor& value, double weight,
                            uint32_t flags) override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    try {
      tensor_metrics_.record(name, value, weight, flags);
    } catch (const std::exception& e) {
      spdlog::warn("[{}] {}", plugin_id, e.what());
    }
  }
  bool metric(const char* name, double* out) const override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    auto value = metrics_.latest(name);
    if (value) *out = *value;
    return value.has_value();
  }
  void request_stop(const std::string& plugin_id, const char* reason) override {
    stop_->request(plugin_id, reason ? reason : "");
  }
  int32_t rank() const override { return group_ ? group_->rank() : 0; }
  int32_t world_size() const override { return group_ ? group_->world_size() : 1; }

  // --- MetricSink (the loops' metrics) -------------------------------------------
  void record(const char* name, double value, double weight, uint32_t flags) override {
    record_metric("kiln", name, value, weight, flags);
  }
  // Every step: by a key looked up once, not by name. The lock stays: it
  // costs ~60 instructions a step uncontended (callgrind, mlp32), and it
  // keeps a plugin that breaks log_metric_tensor's [main-thread] rule in a
  // release build (where nothing checks it) from racing this record.
  void record_loss(const at::Tensor& loss, double weight) override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    try {
      tensor_metrics_.record(loss_key_, loss, weight, KILN_METRIC_REDUCE_MEAN);
    } catch (const std::exception& e) {
      spdlog::warn("[kiln] {}", e.what());
    }
    if (monitors_) monitors_->on_batch(loss, static_cast<int64_t>(weight));
  }

  // --- EventSink (the loops' events: monitors first, then the callbacks) ----------
  void notify(Event event, const kiln_progress& progress) override {
    if (monitors_) {
      if (event == Event::train_epoch_start) monitors_->on_epoch_start();
      if (event == Event::train_batch_end) {
        if (auto metrics = monitors_->on_step_end(progress.global_step))
          loggers_.log(LogRow{LogRow::Kind::step, progress.epoch, progress.global_step, std::move(*metrics)});
      }
      if (event == Event::validation_start) monitors_->on_validation_start();
      if (event == Event::validation_end) monitors_->on_validation_end();
      if (event == Event::train_epoch_end) epoch_monitors_ = monitors_->epoch_values();
    }
    callbacks_->notify(event, progress);
  }
  // A fixed point where every rank reduces: plugins only ever record.
  std::map<std::string, double> reduce() override {
    if (!group_) {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      flush_tensor_metrics();
      return metrics_.reduce();
    }
    std::string mine;
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      flush_tensor_metrics();
      mine = metrics_.export_pending();
    }
    const std::vector<std::string> all = group_->all_gather_text(mine);
    std::vector<std::string> missing;
    std::map<std::string, double> out;
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      out = metrics_.reduce_merged(all, &missing);
    }
    for (const auto& line : missing)
      if (warned_metrics_.insert(line).second) spdlog::warn("{}", line);
    return out;
  }

  void set_aside() override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    flush_tensor_metrics();
    metrics_.set_aside();
  }
  void take_back() override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    metrics_.take_back();
  }

  // --- RunControl (signals, votes, checkpoints, metrics.csv) ---------------------
  // Outside the votes. A preemption signal waits for the next vote, where
  // the checkpoint is taken.
  void check_signal() override {
    const int s = signal_ ? signal_->load() : 0;
    if (s && !(s == preempt_signal_ && command_ == Command::fit)) throw interrupted(s);
  }

  // Stop decisions (a callback's request_stop, a signal, a preemption) are
  // taken by all ranks together in one collective, never by one rank alone:
  // a rank that left the loop early would leave the others waiting in the
  // next gradient all-reduce.
  Votes vote(const Votes& mine) override {
    const int s = signal_ ? signal_->load() : 0;
    const bool preempt = s != 0 && s == preempt_signal_;
    Votes all{mine.stop, preempt, mine.out_of_time};
    bool interrupt = s != 0 && !preempt;
    if (group_) {
      at::Tensor votes = at::tensor({all.stop ? 1.0 : 0.0, interrupt ? 1.0 : 0.0, all.preempt ? 1.0 : 0.0,
                                     all.out_of_time ? 1.0 : 0.0},
                                    at::kDouble);
      group_->all_reduce_sum(votes);
      const auto v = votes.accessor<double, 1>();
      all.stop = v[0] > 0;
      interrupt = v[1] > 0;
      all.preempt = v[2] > 0;
      all.out_of_time = v[3] > 0;
    }
    if (interrupt) throw interrupted(s && !preempt ? s : SIGINT);
    return all;
  }

  std::filesystem::path save_checkpoint(const TrainPosition& position) override {
    // Every rank's unreduced metrics go into the checkpoint, read without a
    // flush: a resumed epoch's metrics are then those of the uninterrupted
    // epoch, bit for bit (docs/checkpoints.md).
    std::vector<std::string> stores, tensors;
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      stores.push_back(metrics_.export_state());
      tensors.push_back(tensor_metrics_.export_state());
    }
    if (group_) {
      stores = group_->all_gather_text(stores[0]);
      tensors = group_->all_gather_text(tensors[0]);
    }
    return checkpointer_->commit(position, [&](const TrainPosition& at) {
      RunStateView view = state_view(at);
      view.metrics_pending = pending_for_older_kilns(stores[0], tensors[0]);
      view.metrics_state = std::move(stores);
      view.tensor_metrics_state = std::move(tensors);
      for (const PluginInstance* p : all_plugins()) view.plugin_states[p->id()] = save_plugin_state(*p);
      return view;
    });
  }

  bool checkpointing() const override { return checkpointing_; }

  // Every rank names the file rank 0 committed (Checkpointer::commit returns
  // it on each), so the supervisor's line names it whichever rank ends first.
  [[noreturn]] void preempted(const TrainPosition& position) override {
    const auto file = save_checkpoint(position);
    const std::string by = "preempted by " + std::string(signal_name(preempt_signal_));
    if (file.empty()) throw RunAborted(KILN_FAILURE_PREEMPTED, by + "; no checkpoint was committed");
    throw RunAborted(KILN_FAILURE_PREEMPTED,
                     by + "; checkpoint committed: " + file.string() + " (continue with --resume last)");
  }

  void log_row(const std::map<std::string, double>& row) override {
    if (rank() != 0) return;
    LogRow out;
    for (const auto& [name, value] : row) {
      if (name == "epoch") out.epoch = static_cast<int64_t>(value);
      else if (name == "step") out.step = static_cast<int64_t>(value);
      else out.metrics[name] = value;
    }
    // The training epoch's monitors (taken at train_epoch_end, just before).
    out.metrics.merge(epoch_monitors_);
    epoch_monitors_.clear();
    loggers_.log(out);
    loggers_.flush();  // an epoch's rows are durable at its end
  }

 private:
  // A log point: tensor metrics are read back now (metrics_mutex_ held).
  void flush_tensor_metrics() {
    try {
      tensor_metrics_.flush_into(metrics_);
    } catch (const std::exception& e) {
      spdlog::warn("{}", e.what());
    }
  }

  static RunAborted interrupted(int s) {
    return RunAborted(KILN_FAILURE_INTERRUPTED, std::string("interrupted by ") + signal_name(s));
  }

  void configure_torch() {
    const int threads = m_.run.threads > 0 ? m_.run.threads : static_cast<int>(std::thread::hardware_concurrency());
    at::set_num_threads(threads);
    if (m_.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    make_current(device_);  // before NCCL and any plugin allocate on "the" GPU
    spdlog::info("kiln {} {}: device {}, precision {}, {} intra-op threads, BLAS {}, run dir {}", KILN_VERSION,
                 command_name(command_), device_.str(), option_name(m_.trainer.precision), at::get_num_threads(),
                 mapped_blas(), m_.run.dir.string());
  }

  void phase(const char* name) {
    if (heartbeat_) heartbeat_->phase(name);
  }

  // Everything between setup and teardown.
  void body() {
    phase(command_name(command_));
    spdlog::debug("start-up: plugins set up (the data module's setup included) at {:.2f} s", seconds_since_start());
    model_.emplace(session_->model(), activity_);
    callbacks_.emplace(session_->callbacks(), activity_);
    SamplingSettings sampling;
    sampling.seed = m_.run.seed;
    sampling.drop_last = m_.trainer.drop_last;
    sampling.rank = rank();
    sampling.world_size = world_size();
    sampling.prefetch = m_.trainer.prefetch;
    sampling.prefetch_threads = m_.trainer.prefetch_threads;
    sampling.prefetch_depth = m_.trainer.prefetch_depth;
    batches_.emplace(DataModuleProxy(session_->data(), activity_), sampling, device_);
    // Mixed precision: the model's steps under autocast; the plugin is unchanged.
    StepModel* steps = &*model_;
    if (m_.trainer.precision != Precision::fp32) steps = &autocast_steps_.emplace(*model_, m_.trainer.precision, device_);
    context_.reset(new LoopContext{*steps, *batches_, *this, *this, progress_, *this});
    context_->rank = rank();
    context_->world_size = world_size();
    context_->max_epochs = max_epochs_;
    context_->max_steps = max_steps_;

    collect_parameters();
    // validate / test / predict evaluate a checkpoint's weights when given
    // one (--ckpt), like Lightning's ckpt_path; fit resumes in fit().
    if (resume_ && command_ != Command::fit) resume_from(*resume_);
    if (command_ != Command::fit) {
      agree_on_start();
      open_run_dir();
    }
    switch (command_) {
      case Command::fit: fit(); break;
      case Command::validate: evaluate(KILN_SPLIT_VAL); break;
      case Command::test: evaluate(KILN_SPLIT_TEST); break;
      case Command::predict: predict(); break;
    }
  }

  int64_t eval_batch_size() const {
    return m_.trainer.eval_batch_size > 0 ? m_.trainer.eval_batch_size : m_.trainer.batch_size;
  }

  // --- fit ----------------------------------------------------------------------
  void fit() {
    const auto& t = m_.trainer;
    const std::vector<ParamGroup> groups = plan_optimizer_groups();
    optimizer_ = make_optimizer(m_.optimizer, groups, trainable_);
    if (rank() == 0) {  // only rank 0 logs
      monitors_.emplace(t.log_every_n_steps, world_size());
      monitors_->attach(*optimizer_);
    }
    FitSettings settings;
    settings.training.spec = EpochSpec{t.shuffle, t.batch_size, limit_train_};
    settings.training.accumulate_grad_batches = t.accumulate_grad_batches;
    settings.training.gradient_clip_val = t.gradient_clip_val;
    settings.training.clip_by_value = t.gradient_clip_algorithm == GradientClipAlgorithm::value;
    settings.training.checkpoint_every_n_steps = checkpointing_ ? m_.checkpoint.every_n_steps : 0;
    settings.val = EpochSpec{false, eval_batch_size(), limit_val_};
    settings.check_val_every_n_epoch = t.check_val_every_n_epoch;
    if (t.fast_dev_run == 0) settings.val_check_interval = t.val_check_interval;
    settings.test_after_fit = t.test_after_fit;
    settings.test = EpochSpec{false, eval_batch_size(), limit_test_};
    settings.checkpoint_every_n_epochs = checkpointing_ ? m_.checkpoint.every_n_epochs : 0;

    if (batches_->length(KILN_SPLIT_TRAIN) == 0)
      batches_->refuse_empty(KILN_SPLIT_TRAIN, "the train split is empty; `kiln fit` needs samples");
    const int64_t train_batches = batches_->batches_per_epoch(KILN_SPLIT_TRAIN, settings.training.spec);
    const int64_t steps_per_epoch = (train_batches + t.accumulate_grad_batches - 1) / t.accumulate_grad_batches;
    const bool per_step = m_.scheduler.interval == SchedulerInterval::step;
    const int64_t total_periods = per_step ? (max_steps_ > 0 ? max_steps_ : steps_per_epoch * std::max<int64_t>(max_epochs_, 1))
                                           : std::max<int64_t>(max_epochs_, 1);
    std::vector<double> base_lrs;
    for (const ParamGroup& g : groups) base_lrs.push_back(g.options.lr);
    const LrSchedule schedule(m_.scheduler, base_lrs, total_periods);
    TrainPosition start;
    if (resume_) start = resume_from(*resume_);
    agree_on_start();
    open_run_dir();
    if (group_)
      grad_sync_ =
          std::make_unique<GradSync>(*group_, trainable_, trainable_names_, m_.distributed.gradient_compression);

    std::optional<GradScaler> scaler;
    if (m_.trainer.precision == Precision::fp16_mixed) scaler.emplace(scaler_state_);
    FitLoop loop(*context_, settings,
                 Optimization{*optimizer_, schedule, trainable_, grad_sync_.get(), scaler ? &*scaler : nullptr}, *stop_);
    // What a user waits for on every run (bench/README.md, "Start-up").
    spdlog::debug("start-up: first training step at {:.2f} s since the process started", seconds_since_start());
    loop.run(start);
    if (group_ && spdlog::should_log(spdlog::level::debug))
      if (const std::string stats = group_->gradient_stats(); !stats.empty()) spdlog::debug("{}", stats);
    if (scaler)
      spdlog::info("16-mixed: {} optimizer steps skipped for inf/NaN gradients; loss scale now {}",
                   scaler_state_.skipped, scaler_state_.scale);
  }

  // [[optimizer.groups]] over the model's parameter names; the description
  // goes into every checkpoint (a resumed run must have the same groups).
  std::vector<ParamGroup> plan_optimizer_groups() {
    std::vector<std::string> names;
    std::vector<bool> trained;
    for (const auto& [name, tensor] : params_) {
      names.push_back(name);
      trained.push_back(tensor.requires_grad());
    }
    std::vector<ParamGroup> groups = plan_param_groups(m_.optimizer, names, trained, model_->id());
    optimizer_groups_ = describe_param_groups(groups, trainable_names_);
    if (!m_.optimizer.groups.empty())
      for (const ParamGroup& g : groups)
        spdlog::info("parameter group {}: {} tensors, lr {}", g.label, g.members.size(), g.options.lr);
    return groups;
  }

  // --- validate, test, predict ------------------------------------------------------
  void evaluate(kiln_split split) {
    EvaluationLoop(*context_, split, EpochSpec{false, eval_batch_size(), split == KILN_SPLIT_VAL ? limit_val_ : limit_test_},
                   /*standalone=*/true)
        .run();
  }

  void predict() {
    const std::vector<at::Tensor> outputs =
        PredictLoop(*context_, EpochSpec{false, eval_batch_size(), m_.trainer.limit_predict_batches}).run();
    if (rank() != 0) return;  // predict is not sharded: rank 0 writes the whole split
    const at::Tensor all = at::cat(outputs).cpu();  // readable by torch.load on any machine
    // Made before anything is written: outputs that are not bytes refuse the
    // run with nothing on disk.
    const std::optional<std::string> text =
        m_.trainer.predictions_text ? std::optional<std::string>(prediction_text(all)) : std::nullopt;
    const std::vector<char> bytes = torch::pickle_save(all);
    const auto file = m_.run.dir / "predictions.pt";
    write_file_durably(file, std::string_view(bytes.data(), bytes.size()));
    spdlog::info("predict: {} rows written to {} (load with torch.load)", all.size(0), file.string());
    if (text) {
      const auto text_file = m_.run.dir / "predictions.txt";
      write_file_durably(text_file, *text);
      spdlog::info("predict: the rows as text in {}", text_file.string());
    }
  }

  // --- checkpoints -------------------------------------------------------------------
  RunStateView state_view(const TrainPosition& position) {
    RunStateView view;
    view.position = position;
    view.manifest_text = m_.text;
    view.monitor = m_.checkpoint.monitor;
    view.params = &params_;
    view.buffers = &buffers_;
    view.optimizer = optimizer_.get();
    view.trainable = &trainable_;
    view.optimizer_groups = optimizer_groups_;
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      if (!m_.checkpoint.monitor.empty()) view.monitored = metrics_.latest(m_.checkpoint.monitor);
      view.metrics_latest = metrics_.export_latest();
    }
    view.saved_by = SavedBy{world_size(), m_.trainer.batch_size};
    view.csv = loggers_.csv_state();
    view.loggers = loggers_.states();
    if (m_.trainer.precision == Precision::fp16_mixed) view.scaler = &scaler_state_;
    view.device = device_;
    return view;
  }

  // Restores a checkpoint into the live run (after setup, before the first step).
  TrainPosition resume_from(const std::filesystem::path& file) {
    RunStateView view = state_view(TrainPosition{});
    resume_point_ = Checkpointer::restore(file, view);
    if (command_ == Command::fit) check_continuation(file, view.position, view.saved_by);
    restore_metrics(file, view);
    loggers_.restore(view.csv, view.loggers);
    for (const PluginInstance* p : all_plugins()) {
      auto it = view.plugin_states.find(p->id());
      if (it != view.plugin_states.end()) load_plugin_state(*p, it->second);
    }
    return view.position;
  }

  // An interrupted epoch's metrics. The same number of ranks: each rank
  // takes back its own, so every sum continues in the same order. Another
  // number: rank 0 takes all of them, merged in rank order.
  void restore_metrics(const std::filesystem::path& file, const RunStateView& view) {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    const size_t ranks = view.metrics_state.size();
    try {
      if (ranks == 0) {  // an older kiln's checkpoint: rank 0's pending sums only
        metrics_.import(view.metrics_latest, rank() == 0 ? view.metrics_pending : "");
        return;
      }
      metrics_.import(view.metrics_latest, "");
      if (ranks == static_cast<size_t>(world_size())) {
        metrics_.add_state(view.metrics_state[rank()]);
        tensor_metrics_.import_state(view.tensor_metrics_state[rank()], device_);
      } else if (rank() == 0) {
        for (size_t r = 0; r < ranks; ++r) {
          metrics_.add_state(view.metrics_state[r]);
          TensorMetrics saved;
          saved.import_state(view.tensor_metrics_state[r], c10::Device(c10::kCPU));
          saved.flush_into(metrics_);
        }
      }
    } catch (const std::invalid_argument& e) {
      throw CheckpointError(file.string() + ": its metrics cannot be read (" + e.what() + ")");
    }
  }

  // A checkpoint taken inside an epoch by a run of another world size or
  // batch size continues from the sample it reached (train/sampler.hpp), or
  // is refused here, before anything is written, where that cannot be exact.
  void check_continuation(const std::filesystem::path& file, TrainPosition& position, const SavedBy& saved) {
    const int64_t world = world_size(), batch = m_.trainer.batch_size;
    if (saved.world_size <= 0 || saved.batch_size <= 0) return;  // an older kiln's: taken as this run's shape
    if (saved.world_size == world && saved.batch_size == batch) return;
    const std::string was = fmt::format("{} process{} with batch size {}", saved.world_size,
                                        saved.world_size == 1 ? "" : "es", saved.batch_size);
    const std::string now = fmt::format("{} process{} with batch size {}", world, world == 1 ? "" : "es", batch);
    if (position.next_batch == 0) {
      spdlog::info("resume: the checkpoint was saved by {}, this run has {}: from epoch {} on, an epoch has {} "
                   "optimizer steps per epoch instead of {}",
                   was, now, position.epoch, steps_per_epoch(world, batch), steps_per_epoch(saved.world_size, saved.batch_size));
      return;
    }
    if (position.next_sample < 0)
      throw CheckpointError(file.string() + ": saved inside epoch " + std::to_string(position.epoch) +
                            " without its sample position; resume it with " + was);
    if (!limit_train_.is_fraction || limit_train_.fraction < 1.0)
      throw CheckpointError(file.string() + ": saved inside epoch " + std::to_string(position.epoch) + " by " + was +
                            "; with trainer.limit_train_batches the epoch cannot be continued exactly by " + now +
                            " (resume with " + was + ", or from a checkpoint at an epoch's end)");
    const int64_t accumulate = m_.trainer.accumulate_grad_batches;
    if (accumulate > 1 && position.next_sample % (batch * world * accumulate) != 0)
      throw CheckpointError(fmt::format(
          "{}: saved inside epoch {} after {} samples by {}; with accumulate_grad_batches = {}, {} would straddle an "
          "optimizer step there (resume with {}, or from a checkpoint at an epoch's end)",
          file.string(), position.epoch, position.next_sample, was, accumulate, now, was));
    batches_->continue_epoch_saved_elsewhere(position.epoch);
    spdlog::info("resume: the checkpoint was saved by {} inside epoch {}, this run has {}: it continues from sample "
                 "{} of the epoch's order, each of its samples trained once; an epoch has {} optimizer steps instead of "
                 "{}, so step-counted settings (max_steps, every_n_steps, per-step schedules) fall at other samples",
                 was, position.epoch, now, position.next_sample, steps_per_epoch(world, batch),
                 steps_per_epoch(saved.world_size, saved.batch_size));
  }

  int64_t steps_per_epoch(int64_t world, int64_t batch) {
    SamplerOptions options;
    options.batch_size = batch;
    options.world_size = world;
    options.drop_last = m_.trainer.drop_last;
    const int64_t batches = limit_train_.apply(batches_in_shard(options, batches_->length(KILN_SPLIT_TRAIN)));
    return (batches + m_.trainer.accumulate_grad_batches - 1) / m_.trainer.accumulate_grad_batches;
  }

  // metrics/pending as kilns before per-rank metric states read it: rank 0's
  // sums with its tensor metrics flushed (into copies: the run's are untouched).
  static std::string pending_for_older_kilns(const std::string& store_state, const std::string& tensor_state) {
    MetricStore store;
    store.add_state(store_state);
    TensorMetrics tensors;
    tensors.import_state(tensor_state, c10::Device(c10::kCPU));
    tensors.flush_into(store);
    return store.export_pending();
  }

  // Parameters and buffers, placed on the run's device in place, so that the
  // plugin's module sees the same tensors the optimizer steps.
  void collect_parameters() {
    ModelProxy::Tensors tensors = model_->parameters();
    if (tensors.params.empty() && command_ == Command::fit)
      throw HookError(model_->id(), "model", "parameters", "the model has no parameters to train");
    for (auto* list : {&tensors.params, &tensors.buffers})
      for (auto& [name, tensor] : *list)
        if (tensor.device() != device_) tensor.set_data(tensor.to(device_));
    params_ = std::move(tensors.params);
    buffers_ = std::move(tensors.buffers);
    trainable_.clear();
    trainable_names_.clear();
    int64_t count = 0;
    for (auto& [name, tensor] : params_) {
      if (tensor.requires_grad()) {
        trainable_.push_back(tensor);
        trainable_names_.push_back(name);
      }
      count += tensor.numel();
    }
    spdlog::info("model '{}': {} parameter tensors ({} values), {} buffers", model_->id(), params_.size(), count,
                 buffers_.size());
    if (command_ == Command::fit) {
      for (const std::string& line : model_summary(parameter_infos(params_))) spdlog::info("  {}", line);
    }
    if (spdlog::should_log(spdlog::level::debug)) {
      // A like-for-like marker: bench/ compares it with a hand-written loop.
      double sum = 0;
      for (auto& [name, tensor] : params_) sum += tensor.sum().item<double>();
      spdlog::debug("initial parameter sum {:.6f}", sum);
    }
  }

  // Only now — every plugin created and set up, any checkpoint restored, the
  // ranks agreed — is anything written: a refused config, a checkpoint of
  // another model or a disagreement (exit 2 or 1) leaves the disk as it was.
  void open_run_dir() {
    // One run directory, one run: rank 0 locks a directory it creates now,
    // unless this run's top process already holds it (util/run_dir_lock.hpp).
    if (rank() == 0)
      create_and_lock_run_dir(m_.run.dir);
    else
      std::filesystem::create_directories(m_.run.dir);
    if (rank() == 0) loggers_.open();
    if (checkpointing_) checkpointer_->open();
  }

  // Every rank runs the same manifest, plugin builds, model shapes, resume
  // point and split lengths, or the run ends on every rank with the
  // difference and the ranks named. Called after any resume, so the weights
  // compared and then broadcast from rank 0 are the resumed ones: all ranks
  // start equal. A no-op in a single process.
  void agree_on_start() {
    if (!group_) return;
    phase("start-up agreement");
    Facts parts;
    parts.emplace_back("manifest", m_.text);
    std::string builds;
    for (const PluginInstance* p : all_plugins())
      builds += p->plugin().slot + " " + p->id() + " " + (p->plugin().descriptor->version ? p->plugin().descriptor->version : "") +
                " " + file_digest(p->plugin().path) + "\n";
    parts.emplace_back("plugin builds", builds);
    std::string shapes;
    for (auto* list : {&params_, &buffers_})
      for (auto& [name, t] : *list) shapes += name + " " + shape_text(t) + " " + std::string(c10::toString(t.scalar_type())) + "\n";
    parts.emplace_back("model parameters", shapes);
    parts.emplace_back("resume point", resume_point_.empty() ? "none (a fresh start)" : resume_point_);
    // The sampler shards each split by its length: ranks that see different
    // lengths (node-local data) would run different numbers of steps.
    std::string lengths;
    for (kiln_split split : splits_used())
      lengths += fmt::format("{} split length {}\n", split_name(split), batches_->length(split));
    parts.emplace_back("data split lengths", lengths);

    if (auto difference = first_difference(group_->all_gather_text(encode_facts(parts))))
      throw std::runtime_error(*difference);
    std::vector<at::Tensor> tensors;
    for (auto* list : {&params_, &buffers_})
      for (auto& [name, t] : *list) tensors.push_back(t);
    {
      torch::NoGradGuard no_grad;
      group_->broadcast(tensors, 0);
    }
    spdlog::debug("start-up agreement: {} ranks agree; rank 0's weights broadcast", world_size());
    phase(command_name(command_));
  }

  // The splits this command reads (their lengths must agree across ranks).
  std::vector<kiln_split> splits_used() const {
    switch (command_) {
      case Command::fit: {
        std::vector<kiln_split> out{KILN_SPLIT_TRAIN};
        if (model_->has_step(KILN_SPLIT_VAL)) out.push_back(KILN_SPLIT_VAL);
        if (m_.trainer.test_after_fit && model_->has_step(KILN_SPLIT_TEST)) out.push_back(KILN_SPLIT_TEST);
        return out;
      }
      case Command::validate: return {KILN_SPLIT_VAL};
      case Command::test: return {KILN_SPLIT_TEST};
      case Command::predict: return {KILN_SPLIT_PREDICT};
    }
    return {};
  }

  static std::string shape_text(const at::Tensor& t) {
    std::string out = "[";
    for (int64_t d = 0; d < t.dim(); ++d) out += (d ? "," : "") + std::to_string(t.size(d));
    return out + "]";
  }

  std::vector<const PluginInstance*> all_plugins() {
    std::vector<const PluginInstance*> out;
    for (const auto& c : session_->callbacks()) out.push_back(c.get());
    out.push_back(&session_->data());
    out.push_back(&session_->model());
    return out;
  }

  const Manifest& m_;
  Heartbeat* heartbeat_;  // may be null
  Activity* activity_;    // may be null
  Command command_;
  const std::atomic<int>* signal_;
  const DistEnv* dist_;  // nullptr unless world size > 1
  at::Device device_;
  Progress progress_;
  Loggers loggers_;  // rank 0 writes
  std::optional<TrainingMonitors> monitors_;  // fit, rank 0
  std::map<std::string, double> epoch_monitors_;  // the epoch's monitors, until its row is logged
  Session* session_ = nullptr;

  mutable std::mutex metrics_mutex_;  // data modules may record from prefetch threads
  MetricStore metrics_;
  TensorMetrics tensor_metrics_;
  const TensorMetrics::Key loss_key_ = tensor_metrics_.key("train/loss");
  std::set<std::string> warned_metrics_;
  std::optional<StopCondition> stop_;

  std::unique_ptr<ProcessGroup> group_;
  std::optional<Checkpointer> checkpointer_;
  std::optional<ModelProxy> model_;
  std::optional<AutocastSteps> autocast_steps_;  // mixed precision: model_ under autocast
  ScalerState scaler_state_;                     // 16-mixed's gradient scaler (checkpointed)
  std::optional<CallbackSet> callbacks_;
  std::optional<SampledBatches> batches_;
  std::unique_ptr<LoopContext> context_;

  NamedTensors params_, buffers_;
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> trainable_names_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::string optimizer_groups_;  // describe_param_groups(), for checkpoints
  std::unique_ptr<GradSync> grad_sync_;
  bool checkpointing_ = false;
  int preempt_signal_ = 0;
  std::optional<std::filesystem::path> resume_;
  std::string resume_point_;  // the checkpoint resumed from and its position, for the agreement
  int64_t max_epochs_, max_steps_;
  BatchLimit limit_train_, limit_val_, limit_test_;
};

}  // namespace

RunOutcome run(const Manifest& manifest, Command command, RunPlugins plugins, const std::atomic<int>* signal,
               const DistEnv* dist, const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat) {
  Run run(manifest, command, signal, dist, resume, heartbeat);
  return run.execute(std::move(plugins));
}

}  // namespace kiln
