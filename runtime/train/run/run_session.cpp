// The session reads top-down, in the order a run happens:
//   set-up      torch, the process group (before any plugin), the parts
//   plugins     created, set up (prepare_data, then every rank's setup)
//   resume      a checkpoint restored into the live run
//   agreement   every rank runs the same thing; rank 0's weights broadcast
//   loops       fit / validate / test / predict (train/loops)
//   teardown    the plugin session's cleanup, whatever happened
// A per-step feature belongs in a loop (train/loops) or in one of the parts
// the loops call; this file only wires them (docs/architecture.md).
#include "train/run/run_session.hpp"

#include <optional>
#include <thread>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "ckpt/checkpointer.hpp"
#include "device/batch_mover.hpp"
#include "distributed/heartbeat.hpp"
#include "distributed/process_group.hpp"
#include "config/hparams.hpp"
#include "metrics/loggers.hpp"
#include "plugin/plugin_instance.hpp"
#include "plugin/proxies.hpp"
#include "train/loops/evaluation_loop.hpp"
#include "train/loops/fit_loop.hpp"
#include "train/loops/predict_loop.hpp"
#include "train/loops/stop_condition.hpp"
#include "optim/nonfinite_watch.hpp"
#include "optim/optim.hpp"
#include "optim/param_groups.hpp"
#include "optim/precision.hpp"
#include "train/prediction_files.hpp"
#include "profiling/profiler.hpp"
#include "train/progress.hpp"
#include "optim/weight_averaging.hpp"
#include "train/run/epoch_collections.hpp"
#include "train/run/event_fan_out.hpp"
#include "train/run/fit_plan.hpp"
#include "train/run/model_state.hpp"
#include "train/run/plugin_services.hpp"
#include "train/run/profile_report.hpp"
#include "train/run/run_checkpoints.hpp"
#include "train/run/run_controller.hpp"
#include "train/run/run_metrics.hpp"
#include "train/run/run_optimizer.hpp"
#include "train/run/run_settings.hpp"
#include "train/run/run_files.hpp"
#include "train/run/start_agreement.hpp"
#include "data/sampled_batches.hpp"
#include "util/errors.hpp"
#include "util/process_info.hpp"
#include "util/run_dir_lock.hpp"

namespace kiln {

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

// Evaluation under distributed.shard = "parameters": each batch frees what
// it gathered; ranks with fewer batches repeat one.
class ShardedResidency final : public EvaluationResidency {
 public:
  explicit ShardedResidency(ShardedParameters& parameters) : parameters_(parameters) {}
  int64_t most_batches(int64_t mine) override { return parameters_.most_batches(mine); }
  void after_batch() override {
    parameters_.release_all();
    parameters_.check();
  }

 private:
  ShardedParameters& parameters_;
};

class Run {
 public:
  Run(const Manifest& manifest, Command command, const std::atomic<int>* signal, const DistEnv* dist,
      const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat)
      : m_(manifest),
        command_(command),
        signal_(signal),
        dist_(dist && dist->world_size > 1 ? dist : nullptr),
        resume_(resume),
        heartbeat_(heartbeat),
        activity_(heartbeat ? heartbeat->activity() : nullptr),
        settings_(RunSettings::of(manifest, command, dist_ != nullptr)),
        device_(manifest.run.device),
        progress_(Progress::mode_from(manifest.trainer.progress), manifest.trainer.log_every_n_steps),
        // TensorBoard's HPARAMS tab: the manifest, --set applied, as dotted keys.
        loggers_(manifest.logging, manifest.run.dir, &manifest.hparams,
                 command == Command::validate || command == Command::test),
        events_(loggers_),
        stop_(settings_.max_epochs, settings_.max_steps, settings_.vote_every_n_steps, settings_.max_seconds) {}

  RunOutcome execute(RunPlugins plugins) {
    configure_torch();
    join_process_group();
    build_parts();
    create_plugins(std::move(plugins));
    // Seeded right before create, so model initialisation is reproducible.
    torch::manual_seed(m_.run.seed);
    phase("plugin set-up");
    RunOutcome outcome;
    const bool local_zero = !dist_ || dist_->local_rank == 0;
    outcome.failure = session_->run(
        stage_of(command_), /*prepare_data=*/local_zero, [&] { if (group_) group_->barrier(); }, [&] { body(); });
    loggers_.finish(run_end(outcome));  // the hparams session's and the MLflow run's end (rank 0's loggers only)
    if (outcome.failure && profiler_ && profiler_->tracing() && profiler_->in_fit())
      write_failed_trace(*profiler_, m_.run.dir, rank());
    context_.reset();
    outcome.metrics = metrics_->latest();
    outcome.calls_abandoned = session_->data().calls_in_flight() > 0;
    // The plugins go now, while the process group and the parts they
    // reached are still there.
    batches_.reset();
    if (collections_) collections_->attach(nullptr, nullptr);  // the proxies go first
    callbacks_.reset();
    autocast_steps_.reset();
    bf16_steps_.reset();
    model_.reset();
    session_.reset();
    return outcome;
  }

 private:
  RunEnd run_end(const RunOutcome& outcome) const {
    RunEnd end;
    if (outcome.failure) {
      const kiln_failure_reason r = outcome.failure->reason;
      end.status = r == KILN_FAILURE_INTERRUPTED || r == KILN_FAILURE_PREEMPTED ? RunEnd::Status::killed
                                                                                 : RunEnd::Status::failed;
    }
    if (checkpointer_) end.final_checkpoint = checkpointer_->last_committed();
    return end;
  }
  int32_t rank() const { return group_ ? group_->rank() : 0; }
  int32_t world_size() const { return group_ ? group_->world_size() : 1; }
  void phase(const char* name) {
    if (heartbeat_) heartbeat_->phase(name);
  }

  // --- set-up ---------------------------------------------------------------------
  void configure_torch() {
    const int threads = m_.run.threads > 0 ? m_.run.threads : static_cast<int>(std::thread::hardware_concurrency());
    at::set_num_threads(threads);
    if (m_.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    make_current(device_);  // before NCCL and any plugin allocate on "the" GPU
    const bool without_masters = m_.trainer.precision == Precision::bf16_true && !steps_float32_masters(m_.trainer);
    spdlog::info("kiln {} {}: device {}, precision {}{}, {} intra-op threads, BLAS {}, run dir {}", KILN_VERSION,
                 command_name(command_), device_.str(), option_name(m_.trainer.precision),
                 without_masters ? " (no master weights: the optimizer steps the bfloat16 weights)" : "",
                 at::get_num_threads(), mapped_blas(), m_.run.dir.string());
  }

  // The process group exists before any plugin: no plugin code can run
  // before every rank has arrived, or launch anything itself. A signal ends
  // any wait at once (a preemption notice excepted: it is voted on at the
  // next step boundary, where the checkpoint is taken).
  void join_process_group() {
    phase("rendezvous");
    if (!dist_) return;
    group_ = std::make_unique<ProcessGroup>(*dist_, m_.distributed, m_.run.device,
                                            [this] { return signal_ending_waits(); });
    spdlog::info("rank {}/{} joined the process group ({} launch; gradients over {})", rank(), world_size(),
                 dist_->launcher, group_->gradient_transport());
  }
  // The signal that ends a collective's wait at once, or "" (none, or a
  // preemption notice).
  std::string signal_ending_waits() const {
    const int s = signal_ ? signal_->load() : 0;
    if (s == 0 || (s == settings_.preempt_signal && command_ == Command::fit)) return "";
    return signal_name(s);
  }

  void build_parts() {
    metrics_.emplace(group_.get());
    checkpointer_.emplace(m_.checkpoint, rank(), [this](bool ok) {
      if (!group_) return ok;
      at::Tensor failed = at::tensor({ok ? 0.0 : 1.0}, at::kDouble);
      group_->all_reduce_sum(failed, "whether its checkpoint write succeeded");
      return failed.item<double>() == 0;
    });
    collections_.emplace(group_.get(), *metrics_, collect_limit_bytes(m_.metrics.collect_limit_mib));
    control_.emplace(settings_, command_, signal_,
                     RunController::Parts{group_.get(), *checkpointer_, *metrics_, events_, loggers_, &*collections_},
                     [this](const TrainPosition& at, RunMetrics::Unreduced unreduced) {
                       return checkpoints_->prepare(at, std::move(unreduced));
                     });
    services_.emplace(*metrics_, stop_, *collections_, run_files_, rank(), world_size());
  }

  void create_plugins(RunPlugins plugins) {
    std::vector<std::unique_ptr<PluginInstance>> callbacks;
    for (size_t i = 0; i < plugins.callbacks.size(); ++i)
      callbacks.push_back(std::make_unique<PluginInstance>(std::move(plugins.callbacks[i]),
                                                           m_.callbacks[i].config_toml, &*services_));
    auto data = std::make_unique<PluginInstance>(std::move(plugins.data), m_.data.config_toml, &*services_);
    auto model = std::make_unique<PluginInstance>(std::move(plugins.model), m_.model.config_toml, &*services_);
    session_.emplace(std::move(callbacks), std::move(data), std::move(model), rank());
    session_->interrupted_by([this] { return signal_ending_waits(); });
  }

  // --- between the plugins' setup and teardown ---------------------------------------
  void body() {
    phase(command_name(command_));
    spdlog::debug("start-up: plugins set up (the data module's setup included) at {:.2f} s; peak resident memory {} MB",
                  seconds_since_start(), peak_resident_mb());
    wire_loops();
    collect_model_state(*model_, device_, command_, state_, m_.trainer.precision == Precision::bf16_true,
                        shards_parameters());
    // Sharded parameters are checked once sharded (fit()): a check that runs
    // the model reads every weight, and each rank would hold them all.
    if (!shards_parameters()) check_batches();
    if (m_.averaging.kind != AveragingKind::none) {
      averaging_.emplace(m_.averaging, settings_.max_epochs, state_.params, state_.buffers);
      checkpointer_->parts().add("average", averaging_->checkpoint_part(), load_priority::run);
    }
    // validate / test / predict evaluate a checkpoint's weights when given
    // one (--ckpt), like Lightning's ckpt_path; fit resumes in fit().
    if (command_ != Command::fit) {
      // The rows say which step's weights were evaluated.
      if (resume_) context_->global_step = checkpoints_->resume(*resume_, command_).global_step;
      use_averaged_weights();
      agree();
      open_run_dir();
    }
    switch (command_) {
      case Command::fit: fit(); break;
      case Command::validate: evaluate(KILN_SPLIT_VAL); break;
      case Command::test: evaluate(KILN_SPLIT_TEST); break;
      case Command::predict: predict(); break;
    }
  }

  void wire_loops() {
    model_.emplace(session_->model(), activity_);
    callbacks_.emplace(session_->callbacks(), activity_);
    events_.set_callbacks(&*callbacks_);
    SamplingSettings sampling;
    sampling.seed = m_.run.seed;
    sampling.drop_last = m_.trainer.drop_last;
    sampling.rank = rank();
    sampling.world_size = world_size();
    sampling.data_workers = static_cast<int>(m_.trainer.data_workers.value);
    sampling.prefetch_batches = static_cast<int>(m_.trainer.prefetch_batches.value);
    batches_.emplace(DataModuleProxy(session_->data(), activity_), sampling, device_);
    if (settings_.overfit && command_ == Command::fit) batches_->validate_on_training_split();
    if (m_.profiler.kind != ProfilerKind::none && command_ == Command::fit) {
      profiler_ = std::make_shared<Profiler>(m_.profiler.kind, rank());
      batches_->profile_with(profiler_);
    } else if (m_.profiler.kind != ProfilerKind::none && rank() == 0) {
      spdlog::warn("[profiler] kind = '{}' profiles `kiln fit` only; this `kiln {}` is not profiled",
                   option_name(m_.profiler.kind), command_name(command_));
    }
    // Mixed precision: the model's steps under autocast; the plugin is unchanged.
    StepModel* steps = &*model_;
    if (m_.trainer.precision == Precision::bf16_true)
      steps = &bf16_steps_.emplace(*model_);
    else if (m_.trainer.precision != Precision::fp32)
      steps = &autocast_steps_.emplace(*model_, m_.trainer.precision, device_);
    context_.reset(new LoopContext{*steps, *batches_, events_, *metrics_, progress_, *control_});
    context_->activity = activity_;
    context_->profiler = profiler_.get();
    collections_->attach(&*model_, &*callbacks_);
    if (collections_->consumed()) context_->collector = &*collections_;
    context_->rank = rank();
    context_->world_size = world_size();
    context_->max_epochs = settings_.max_epochs;
    context_->max_steps = settings_.max_steps;
    checkpoints_.emplace(m_, settings_, rank(), world_size(), device_,
                         RunCheckpoints::Parts{*checkpointer_, state_, *metrics_, *batches_, [this] { return all_plugins(); },
                                               &*collections_});
    // Only a fit continues its loggers' files from a checkpoint (validate,
    // test and predict write files of their own, docs/logging.md).
    if (command_ == Command::fit)
      checkpointer_->parts().add("logger", loggers_.checkpoint_part(), load_priority::run);
  }

  // The model looks at the first samples of each split this command reads
  // (ABI 1.5), so that a model and data that do not fit together are
  // refused now, exit 2, before anything is written — not at the first step.
  // The sample's request says for_check, so a data module leaves no trace
  // of it (docs/abi.md); one built before 1.5 cannot tell, and is not asked.
  void check_batches() {
    if (!model_->has_check_batch()) return;
    const LoadedPlugin& data = session_->data().plugin();
    if (data.abi_minor < 5) {
      if (rank() == 0)
        spdlog::info("data module '{}' (ABI 1.{}) cannot tell the batch check's sample from a step's batch: "
                     "model '{}' checks none before the run (rebuild the data module against kiln's SDK 1.5 or later)",
                     data.id(), data.abi_minor, model_->id());
      return;
    }
    for (kiln_split split : splits_used()) {
      BatchPtr sample = batches_->sample(split, 2);
      if (sample && m_.trainer.precision == Precision::bf16_true) floating_to_bf16(*sample);  // as the steps see it
      if (sample) model_->check_batch(split, *sample);
    }
  }

  // --- agreement ---------------------------------------------------------------------
  // Called after any resume, so the weights compared and then broadcast from
  // rank 0 are the resumed ones. A no-op in a single process.
  void agree() {
    if (!group_) return;
    phase("start-up agreement");
    std::string lengths;
    for (kiln_split split : splits_used())
      lengths += fmt::format("{} split length {}\n", split_name(split), batches_->length(split));
    agree_on_start(*group_,
                   StartFacts{m_.text, all_plugins(), checkpoints_->resume_point(), lengths, shards_parameters()},
                   state_);
    phase(command_name(command_));
  }

  bool shards_parameters() const {
    return command_ == Command::fit && m_.distributed.shard == ShardMode::parameters;
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
    run_files_.open(m_.run.dir, rank() == 0);
    if (settings_.checkpointing) checkpointer_->open();
  }

  // --- loops -------------------------------------------------------------------------
  void fit() {
    const std::vector<ParamGroup> groups = plan_optimizer_groups(m_, state_, model_->id());
    optimizer_.emplace(m_, state_, groups, *checkpoints_, group_.get(), rank(), world_size());
    if (rank() == 0)  // only rank 0 logs
      metrics_->attach_monitors(&events_.start_monitors(m_.trainer.log_every_n_steps, world_size(), *state_.optimizer));
    const FitSettings settings = fit_settings(m_, settings_, resume_.has_value());
    if (batches_->length(KILN_SPLIT_TRAIN) == 0)
      batches_->refuse_empty(KILN_SPLIT_TRAIN, "the train split is empty; `kiln fit` needs samples");
    if (settings_.overfit && rank() == 0) {
      // Say which batches: a count larger than the split is all of it.
      const int64_t all = batches_->batches_per_epoch(KILN_SPLIT_TRAIN, EpochSpec{false, m_.trainer.batch_size, {}});
      const int64_t used = batches_->batches_per_epoch(KILN_SPLIT_TRAIN, settings.training.spec);
      spdlog::info("trainer.overfit_batches: training and validating on the first {} of the train split's {} "
                   "batches{}, in order, each epoch",
                   used, all, world_size() > 1 ? " per rank" : "");
    }
    LrSchedule schedule =
        lr_schedule(m_, settings_, groups, batches_->batches_per_epoch(KILN_SPLIT_TRAIN, settings.training.spec));
    TrainPosition start;
    if (resume_) start = checkpoints_->resume(*resume_, command_);
    agree();
    // ZeRO-3: each rank keeps its part of rank 0's (or the resumed) weights.
    ShardedParameters* sharded = optimizer_->sharded_parameters();
    if (sharded) {
      phase("start-up agreement");
      sharded->shard();
      phase(command_name(command_));
      spdlog::debug("start-up: parameters sharded at {:.2f} s; peak resident memory {} MB", seconds_since_start(),
                    peak_resident_mb());
      sharded->set_profiler(profiler_.get());
      // The model's look at its batches reads the weights through the shards.
      ShardedParameters::Active reading(*sharded);
      struct Release {  // however the check ends
        ShardedParameters& parameters;
        ~Release() { parameters.release_all(); }
      } release{*sharded};
      check_batches();
      sharded->check();
    }
    optimizer_->weights_agreed(resume_.has_value());
    // From the agreed weights (rank 0's), so every rank averages alike.
    if (averaging_) averaging_->begin_fit(resume_.has_value());
    if (averaging_ && m_.averaging.kind == AveragingKind::swa && m_.averaging.swa_lr > 0)
      schedule.anneal_to(m_.averaging.swa_lr, swa_start_epoch(m_.averaging, settings_.max_epochs),
                         m_.averaging.annealing_epochs);
    open_run_dir();
    std::optional<GradScaler> scaler;
    if (m_.trainer.precision == Precision::fp16_mixed) scaler.emplace(state_.scaler);
    NonfiniteWatch& nonfinite =
        nonfinite_.emplace(m_.trainer.detect_nonfinite, m_.trainer.log_every_n_steps,
                           sum_over_ranks("its non-finite check"));
    if (nonfinite.on())
      control_->guard_commits([this](const TrainPosition& at) {
        // A checkpoint at an epoch's end continues with the next epoch; its
        // steps ran in the one that ended.
        const int64_t ran_in = at.next_batch == 0 && at.epoch > 0 ? at.epoch - 1 : at.epoch;
        return nonfinite_->may_commit(optimizer_->stepped_weights(), at.global_step, ran_in);
      });
    const std::unique_ptr<OptimizerStep> step =
        optimizer_->step(scaler ? &*scaler : nullptr, nonfinite.on() ? &nonfinite : nullptr,
                         averaging_ ? &*averaging_ : nullptr, profiler_.get());
    Optimization optimization{*step, *state_.optimizer, schedule};
    if (nonfinite.on()) optimization.nonfinite = &nonfinite;
    if (averaging_) optimization.averaging = &*averaging_;
    FitLoop loop(*context_, settings, optimization, stop_);
    // What a user waits for on every run (bench/README.md, "Start-up").
    spdlog::debug("start-up: first training step at {:.2f} s since the process started; peak resident memory {} MB",
                  seconds_since_start(), peak_resident_mb());
    if (sharded) {
      ShardedResidency residency(*sharded);
      context_->residency = &residency;
      struct Unset {  // however the loop ends
        LoopContext& context;
        ~Unset() { context.residency = nullptr; }
      } unset{*context_};
      ShardedParameters::Active reading(*sharded);
      loop.run(start);
      const ShardedParameters::Stats stats = sharded->stats();
      spdlog::info("distributed.shard = parameters: {} gathers, {} of them fetched ahead; {:.2f} s waited for "
                   "gathers; at most {} of the {} bytes of weights whole at once ({} for a commit); {} parameters "
                   "made whole in memory of their own, the rest in a freed bucket's",
                   stats.gathers, stats.prefetched, stats.waiting_s, stats.peak_whole_bytes, stats.total_bytes,
                   stats.commit_whole_bytes, stats.allocations);
    } else {
      loop.run(start);
    }
    spdlog::debug("fit: peak resident memory {} MB (its commits included)", peak_resident_mb());
    if (profiler_) report_profile(*profiler_, group_.get(), m_.run.dir, rank());
    if (group_ && spdlog::should_log(spdlog::level::debug))
      if (const std::string stats = group_->gradient_stats(); !stats.empty()) spdlog::debug("{}", stats);
    if (scaler)
      spdlog::info("16-mixed: {} optimizer steps skipped for inf/NaN gradients; loss scale now {}",
                   state_.scaler.skipped, state_.scaler.scale);
  }

  // validate / test / predict of a checkpoint with averaged weights: those
  // are evaluated, as Lightning evaluates the averaged model.
  void use_averaged_weights() {
    if (!averaging_ || !resume_) return;
    if (!averaging_->state().restored || averaging_->state().count == 0) {
      spdlog::warn("averaging: {} holds no averaged weights yet; its trained weights are evaluated",
                   resume_->string());
      return;
    }
    averaging_->copy_into_model();
    const AveragedState& restored = averaging_->state();
    spdlog::info("averaging: evaluating the checkpoint's {} weights ({} updates)",
                 restored.restored_kind.empty() ? restored.kind : restored.restored_kind, restored.count);
  }

  // A sum over the ranks of a small CPU tensor, in place; empty in one
  // process. `contribution` names each rank's part (ProcessGroup::all_reduce_sum).
  std::function<void(at::Tensor&)> sum_over_ranks(const char* contribution) {
    if (!group_) return {};
    return [this, contribution](at::Tensor& t) { group_->all_reduce_sum(t, contribution); };
  }

  void evaluate(kiln_split split) {
    const BatchLimit& limit = split == KILN_SPLIT_VAL ? settings_.limit_val : settings_.limit_test;
    EvaluationLoop(*context_, split, EpochSpec{false, settings_.eval_batch_size, limit}, /*standalone=*/true).run();
  }

  void predict() {
    const std::vector<at::Tensor> outputs =
        PredictLoop(*context_, EpochSpec{false, settings_.eval_batch_size, m_.trainer.limit_predict_batches}).run();
    if (rank() != 0) return;  // predict is not sharded: rank 0 writes the whole split
    write_prediction_files(outputs, m_.run.dir, session_->data().id(), m_.trainer.predictions_text);
  }

  std::vector<const PluginInstance*> all_plugins() {
    std::vector<const PluginInstance*> out;
    for (const auto& c : session_->callbacks()) out.push_back(c.get());
    out.push_back(&session_->data());
    out.push_back(&session_->model());
    return out;
  }

  // What the run is: the manifest, the command, its place among the ranks.
  const Manifest& m_;
  const Command command_;
  const std::atomic<int>* signal_;
  const DistEnv* dist_;  // nullptr unless world size > 1
  const std::optional<std::filesystem::path> resume_;
  Heartbeat* heartbeat_;  // may be null
  Activity* activity_;    // may be null
  const RunSettings settings_;
  const at::Device device_;
  // The parts the loops and the plugins call.
  Progress progress_;
  Loggers loggers_;  // rank 0 writes
  EventFanOut events_;
  StopCondition stop_;
  std::unique_ptr<ProcessGroup> group_;
  std::optional<RunMetrics> metrics_;
  std::optional<Checkpointer> checkpointer_;
  std::optional<RunController> control_;
  std::optional<EpochCollections> collections_;
  RunFiles run_files_;
  std::optional<PluginServices> services_;
  std::optional<RunCheckpoints> checkpoints_;
  // The plugins, through their proxies, and what the loops read.
  std::optional<Session> session_;
  std::optional<ModelProxy> model_;
  std::optional<AutocastSteps> autocast_steps_;  // mixed precision: model_ under autocast
  std::optional<TrueBf16Steps> bf16_steps_;      // bf16-true: model_ given bfloat16 batches
  std::optional<CallbackSet> callbacks_;
  std::optional<SampledBatches> batches_;
  std::unique_ptr<LoopContext> context_;
  // The model's training state.
  TrainingState state_;
  std::optional<RunOptimizer> optimizer_;     // fit
  std::optional<NonfiniteWatch> nonfinite_;  // fit: trainer.detect_nonfinite
  std::shared_ptr<Profiler> profiler_;       // fit with [profiler]
  std::optional<WeightAveraging> averaging_;  // [averaging]
};

}  // namespace

RunOutcome run_session(const Manifest& manifest, Command command, RunPlugins plugins, const std::atomic<int>* signal,
                       const DistEnv* dist, const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat) {
  Run run(manifest, command, signal, dist, resume, heartbeat);
  return run.execute(std::move(plugins));
}

}  // namespace kiln
