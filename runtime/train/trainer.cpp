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

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/retention.hpp"
#include "ckpt/run_state.hpp"
#include "dist/agreement.hpp"
#include "dist/grad_sync.hpp"
#include "dist/heartbeat.hpp"
#include "dist/process_group.hpp"
#include "kiln/tensor.hpp"
#include "metrics/csv_log.hpp"
#include "metrics/metric_store.hpp"
#include "plugin/host_objects.hpp"
#include "plugin/plugin_instance.hpp"
#include "train/optim.hpp"
#include "train/prefetcher.hpp"
#include "train/progress.hpp"
#include "train/sampler.hpp"
#include "util/errors.hpp"
#include "util/process_info.hpp"

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

const char* split_name(kiln_split split) {
  switch (split) {
    case KILN_SPLIT_TRAIN: return "train";
    case KILN_SPLIT_VAL: return "val";
    case KILN_SPLIT_TEST: return "test";
    default: return "predict";
  }
}

std::string format_metrics(const std::map<std::string, double>& metrics) {
  std::string out;
  for (const auto& [name, value] : metrics) out += fmt::format("  {} {:.4f}", name, value);
  return out;
}

using CallbackHook = kiln_callback_hook kiln_callback_hooks::*;

// How often ranks vote on stopping (a callback's request, a signal, a
// preemption) inside an epoch. Each vote is a collective round trip; voting
// every step cost mlp256 ~25 % of its 2-process epoch on this machine, and a
// stop acted on 16 steps later is still prompt (bench/README.md).
constexpr int64_t kAgreeEveryNSteps = 16;

// Everything one run owns; the plugins reach it through RunServices.
class Run final : public RunServices {
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
        csv_(manifest.run.dir / "metrics.csv") {
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
    // Lightning's fast_dev_run writes no checkpoints either.
    checkpointing_ = m_.checkpoint.enabled && command_ == Command::fit && t.fast_dev_run == 0;
    if (m_.checkpoint.enabled && m_.checkpoint.preempt_signal != PreemptSignal::none)
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
        return s == SIGTERM ? "SIGTERM" : s == SIGUSR1 ? "SIGUSR1" : "SIGINT";
      });
      spdlog::info("rank {}/{} joined the process group ({} launch)", rank(), world_size(), dist_->launcher);
    }

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
    session_ = nullptr;
    outcome.metrics = metrics_.latest();
    outcome.calls_abandoned = session.data().calls_in_flight() > 0;
    return outcome;
  }

  // --- RunServices --------------------------------------------------------
  void record_metric(const std::string& plugin_id, const char* name, double value, double weight,
                     uint32_t flags) override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    try {
      metrics_.record(name, value, weight, flags);
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
    if (!stop_requested_) spdlog::info("stop requested by '{}': {}", plugin_id, reason);
    stop_requested_ = true;
  }
  int32_t rank() const override { return group_ ? group_->rank() : 0; }
  int32_t world_size() const override { return group_ ? group_->world_size() : 1; }

 private:
  void configure_torch() {
    const int threads = m_.run.threads > 0 ? m_.run.threads : static_cast<int>(std::thread::hardware_concurrency());
    at::set_num_threads(threads);
    if (m_.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    spdlog::info("kiln {} {}: device {}, {} intra-op threads, BLAS {}, run dir {}", KILN_VERSION,
                 command_name(command_), device_.str(), at::get_num_threads(), mapped_blas(),
                 m_.run.dir.string());
  }

  void phase(const char* name) {
    if (heartbeat_) heartbeat_->phase(name);
  }

  void body() {
    phase(command_name(command_));
    collect_parameters();
    // validate / test / predict evaluate a checkpoint's weights when given
    // one (--ckpt), like Lightning's ckpt_path; fit resumes in fit().
    if (resume_ && command_ != Command::fit) resume_from(*resume_, nullptr);
    if (command_ != Command::fit) {
      agree_on_start();
      open_run_dir();
    }
    switch (command_) {
      case Command::fit: fit(); break;
      case Command::validate: evaluate(KILN_SPLIT_VAL, &kiln_model_hooks::validation_step, true); break;
      case Command::test: evaluate(KILN_SPLIT_TEST, &kiln_model_hooks::test_step, true); break;
      case Command::predict: predict(); break;
    }
  }

  PluginInstance& model() { return session_->model(); }
  PluginInstance& data() { return session_->data(); }

  // Outside the training loop's agreement points. A preemption signal waits
  // for the next training step boundary, where the checkpoint is taken.
  void check_signal() const {
    const int s = signal_ ? signal_->load() : 0;
    if (s && !(s == preempt_signal_ && command_ == Command::fit)) throw interrupted(s);
  }
  static RunAborted interrupted(int s) {
    return RunAborted(KILN_FAILURE_INTERRUPTED, std::string("interrupted by ") + (s == SIGTERM ? "SIGTERM" : "SIGINT"));
  }

  // Stop decisions (a callback's request_stop, max_steps, a signal) are taken
  // by all ranks together in one collective, never by one rank alone: a rank
  // that left the loop early would leave the others waiting in the next
  // gradient all-reduce.
  //
  // `position` is where a resumed run would continue; a preemption commits a
  // checkpoint there before the run ends with KILN_FAILURE_PREEMPTED.
  bool agree_to_stop(bool local_stop, const TrainPosition& position, torch::optim::Optimizer* optimizer) {
    const int s = signal_ ? signal_->load() : 0;
    const bool preempt = s != 0 && s == preempt_signal_;
    bool stop = local_stop, interrupt = s != 0 && !preempt, preempted = preempt;
    if (group_) {
      at::Tensor votes = at::tensor({stop ? 1.0 : 0.0, interrupt ? 1.0 : 0.0, preempted ? 1.0 : 0.0}, at::kDouble);
      group_->all_reduce_sum(votes);
      stop = votes[0].item<double>() > 0;
      interrupt = votes[1].item<double>() > 0;
      preempted = votes[2].item<double>() > 0;
    }
    if (interrupt) throw interrupted(s && !preempt ? s : SIGINT);
    if (preempted) {
      const auto file = save_checkpoint(position, optimizer);
      throw RunAborted(KILN_FAILURE_PREEMPTED, "preempted by " + std::string(preempt_signal_ == SIGUSR1 ? "SIGUSR1" : "SIGTERM") +
                                                   "; checkpoint committed: " + file.string() +
                                                   " (continue with --resume last)");
    }
    return stop;
  }

  // --- checkpoints ------------------------------------------------------------
  RetentionPolicy retention() const {
    return RetentionPolicy{m_.checkpoint.monitor, m_.checkpoint.mode, m_.checkpoint.save_top_k};
  }

  // Rank 0 finds what earlier runs left: stale temporaries are removed and
  // committed checkpoints join the ranking (and may be pruned by it).
  void prepare_checkpoint_dir() {
    if (!checkpointing_ || rank() != 0) return;
    const auto& dir = m_.checkpoint.dir;
    std::filesystem::create_directories(dir);
    for (const auto& removed : sweep_temporaries(dir))
      spdlog::warn("removed {} left by an interrupted checkpoint write", removed.string());
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("epoch=", 0) != 0 || entry.path().extension() != ".ckpt") continue;
      // One read validates (checksum included) and yields the metadata.
      CheckpointMeta meta;
      try {
        meta = read_meta(CheckpointFile::read(entry.path()));
      } catch (const CheckpointError& e) {
        spdlog::warn("ignoring {}", e.what());
        continue;
      }
      ranked_.push_back(CheckpointInfo{entry.path(), meta.position.epoch, meta.position.global_step, meta.monitored, false});
    }
  }

  std::optional<double> monitored() const {
    if (m_.checkpoint.monitor.empty()) return std::nullopt;
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    return metrics_.latest(m_.checkpoint.monitor);
  }

  // Only rank 0 writes replicated state; every rank then learns, in one
  // collective, whether the commit happened, and none goes on if it did not.
  std::filesystem::path save_checkpoint(const TrainPosition& position, torch::optim::Optimizer* optimizer) {
    const auto& c = m_.checkpoint;
    std::filesystem::path written;
    std::string error;
    if (rank() == 0) {
      try {
        RunStateView view = state_view(position, optimizer);
        for (const PluginInstance* p : all_plugins()) view.plugin_states[p->id()] = plugin_state(*p);
        const auto ranked = c.dir / checkpoint_name(position.epoch, position.global_step);
        const auto last = c.dir / "last.ckpt";
        if (c.save_top_k != 0) {
          save_run_state(ranked, view);
          // A resumed run can commit a name an earlier run already used (it
          // died between that commit and pruning): the new file replaced the
          // old, so it replaces the old entry too, or pruning would delete it.
          ranked_.erase(std::remove_if(ranked_.begin(), ranked_.end(),
                                       [&](const CheckpointInfo& i) { return i.path == ranked; }),
                        ranked_.end());
          ranked_.push_back(CheckpointInfo{ranked, position.epoch, position.global_step, view.monitored, false});
          written = ranked;
          if (c.save_last) link_checkpoint(ranked, last);
        } else {
          save_run_state(last, view);
          written = last;
        }
        // Older checkpoints go only now, after the new one is durable.
        for (const auto& old : to_delete(ranked_, retention())) {
          std::error_code ec;
          std::filesystem::remove(old, ec);
          ranked_.erase(std::remove_if(ranked_.begin(), ranked_.end(), [&](const CheckpointInfo& i) { return i.path == old; }),
                        ranked_.end());
        }
        spdlog::info("checkpoint committed: {}", written.string());
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    bool ok = error.empty();
    if (group_) {
      at::Tensor failed = at::tensor({ok ? 0.0 : 1.0}, at::kDouble);
      group_->all_reduce_sum(failed);
      ok = failed.item<double>() == 0;
    }
    if (ok) return written;
    // The cause is rank 0's; the other ranks only learn that it failed.
    if (rank() != 0) throw PeerFailure("rank 0 failed to commit a checkpoint (its report names the cause)");
    throw std::runtime_error("checkpoint not committed: " + error);
    return written;
  }

  RunStateView state_view(const TrainPosition& position, torch::optim::Optimizer* optimizer) {
    RunStateView view;
    view.position = position;
    view.manifest_text = m_.text;
    view.monitor = m_.checkpoint.monitor;
    view.monitored = monitored();
    view.params = &params_;
    view.buffers = &buffers_;
    view.optimizer = optimizer;
    view.trainable = &trainable_;
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      view.metrics_latest = metrics_.export_latest();
      view.metrics_pending = metrics_.export_pending();
    }
    view.csv = csv_.text();
    return view;
  }

  std::map<std::string, std::string> plugin_state(const PluginInstance& p) {
    kiln_state_writer writer;
    if (auto fn = p.plugin().lifecycle().state_save)
      p.check(fn(p.instance(), reinterpret_cast<kiln_state_writer*>(&writer)), "state_save");
    return writer.blobs;
  }

  // Restores a checkpoint into the live run (after setup, before the first step).
  TrainPosition resume_from(const std::filesystem::path& file, torch::optim::Optimizer* optimizer) {
    const CheckpointFile checkpoint = CheckpointFile::read(file);
    RunStateView view = state_view(TrainPosition{}, optimizer);
    restore_run_state(checkpoint, view);
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      // Every rank resumes the same replicated state; the pending metrics of
      // an interrupted epoch belong to the rank that saved them.
      metrics_.import(view.metrics_latest, rank() == 0 ? view.metrics_pending : "");
    }
    csv_.restore(view.csv);
    for (const PluginInstance* p : all_plugins()) {
      auto fn = p->plugin().lifecycle().state_load;
      auto it = view.plugin_states.find(p->id());
      if (!fn || it == view.plugin_states.end()) continue;
      kiln_state_reader reader;
      reader.blobs = &it->second;
      p->check(fn(p->instance(), &reader), "state_load");
    }
    spdlog::info("resumed from {}: epoch {}, batch {}, step {}", file.string(), view.position.epoch,
                 view.position.next_batch, view.position.global_step);
    std::error_code ec;
    resume_point_ = fmt::format("{} ({} bytes): epoch {}, batch {}, step {}", file.filename().string(),
                                std::filesystem::file_size(file, ec), view.position.epoch, view.position.next_batch,
                                view.position.global_step);
    return view.position;
  }

  // Parameters and buffers, placed on the run's device in place, so that the
  // plugin's module sees the same tensors the optimizer steps.
  void collect_parameters() {
    struct Visit {
      std::vector<std::pair<std::string, at::Tensor>> params, buffers;
      std::string error;
    } visit;
    auto visitor = [](void* context, const char* name, kiln_tensor* tensor, uint32_t flags) noexcept {
      auto* v = static_cast<Visit*>(context);
      try {
        auto& list = flags == KILN_TENSOR_BUFFER ? v->buffers : v->params;
        list.emplace_back(name ? name : "", borrow_tensor(tensor));
      } catch (const std::exception& e) {
        v->error = e.what();
      }
    };
    model().check(model().plugin().model_hooks().parameters(model().instance(), &visit, visitor), "parameters");
    if (!visit.error.empty()) throw std::runtime_error("reading the model's parameters: " + visit.error);
    if (visit.params.empty() && command_ == Command::fit)
      throw HookError(model().id(), "model", "parameters", "the model has no parameters to train");
    for (auto* list : {&visit.params, &visit.buffers})
      for (auto& [name, tensor] : *list)
        if (tensor.device() != device_) tensor.set_data(tensor.to(device_));
    params_ = visit.params;
    buffers_ = visit.buffers;
    trainable_.clear();
    trainable_names_.clear();
    int64_t count = 0;
    for (auto& [name, tensor] : visit.params) {
      if (tensor.requires_grad()) {
        trainable_.push_back(tensor);
        trainable_names_.push_back(name);
      }
      count += tensor.numel();
    }
    spdlog::info("model '{}': {} parameter tensors ({} values), {} buffers", model().id(), visit.params.size(),
                 count, visit.buffers.size());
    if (spdlog::should_log(spdlog::level::debug)) {
      // A like-for-like marker: bench/ compares it with a hand-written loop.
      double sum = 0;
      for (auto& [name, tensor] : visit.params) sum += tensor.sum().item<double>();
      spdlog::debug("initial parameter sum {:.6f}", sum);
    }
  }

  // Only now — every plugin created and set up, any checkpoint restored, the
  // ranks agreed — is anything written: a refused config, a checkpoint of
  // another model or a disagreement (exit 2 or 1) leaves the disk as it was.
  void open_run_dir() {
    std::filesystem::create_directories(m_.run.dir);
    prepare_checkpoint_dir();
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
    for (kiln_split split : splits_used()) lengths += fmt::format("{} split length {}\n", split_name(split), length(split));
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
    const auto& hooks = session_->model().plugin().model_hooks();
    switch (command_) {
      case Command::fit: {
        std::vector<kiln_split> out{KILN_SPLIT_TRAIN};
        if (hooks.validation_step) out.push_back(KILN_SPLIT_VAL);
        if (m_.trainer.test_after_fit && hooks.test_step) out.push_back(KILN_SPLIT_TEST);
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
    out.push_back(&data());
    out.push_back(&model());
    return out;
  }

  int64_t length(kiln_split split) {
    int64_t n = 0;
    data().check(data().plugin().data_hooks().length(data().instance(), split, &n), "length");
    if (n < 0) throw HookError(data().id(), "data", "length", "returned a negative length");
    return n;
  }

  SamplerOptions sampler_options(kiln_split split, bool shuffle, int64_t batch_size, const BatchLimit& limit,
                                 int64_t length) const {
    SamplerOptions options;
    options.seed = m_.run.seed;
    options.shuffle = shuffle;
    options.drop_last = split == KILN_SPLIT_TRAIN && m_.trainer.drop_last;
    options.batch_size = batch_size;
    options.rank = rank();
    options.world_size = split == KILN_SPLIT_PREDICT ? 1 : world_size();
    options.equal_shards = split == KILN_SPLIT_TRAIN;
    options.max_batches = limit.apply(batches_in_shard(options, length));
    return options;
  }

  Prefetcher batches(kiln_split split, int64_t epoch, bool shuffle, int64_t batch_size, const BatchLimit& limit,
                     int64_t first_batch = 0) {
    const int64_t n = length(split);
    const SamplerOptions options = sampler_options(split, shuffle, batch_size, limit, n);
    BatchPlan plan = plan_epoch(options, epoch, n);
    plan.drop_front(static_cast<size_t>(first_batch));  // a resumed epoch continues where it stopped
    if (split == KILN_SPLIT_TRAIN && epoch == 0 && plan.indices.size() >= 5)
      spdlog::debug("epoch 0 order starts {} {} {} {} {}", plan.indices[0], plan.indices[1], plan.indices[2],
                    plan.indices[3], plan.indices[4]);
    return Prefetcher(data(), split, std::move(plan), m_.trainer.prefetch_threads,
                      m_.trainer.prefetch_depth);
  }

  void to_device(kiln_batch& batch) {
    if (device_.is_cpu()) return;
    for (auto& [name, tensor] : batch.tensors) tensor = tensor.to(device_, /*non_blocking=*/true);
  }

  static int64_t batch_rows(const kiln_batch& batch) {
    for (const auto& [name, tensor] : batch.tensors)
      if (tensor.dim() > 0) return tensor.size(0);
    return 1;
  }

  kiln_progress progress(kiln_stage stage, int64_t epoch, int64_t batch_index) const {
    kiln_progress p{};
    p.struct_size = sizeof(p);
    p.stage = stage;
    p.epoch = epoch;
    p.global_step = global_step_;
    p.batch_index = batch_index;
    p.max_epochs = max_epochs_;
    p.max_steps = max_steps_;
    return p;
  }

  void call_callbacks(CallbackHook hook, const char* name, const kiln_progress& p) {
    for (const auto& cb : session_->callbacks())
      if (kiln_callback_hook fn = cb->plugin().callback_hooks().*hook) {
        InHook in(activity_, name);
        cb->check(fn(cb->instance(), &p), name);
      }
  }

  // A fixed point where every rank reduces: plugins only ever record.
  std::map<std::string, double> reduce_metrics() {
    if (!group_) {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      return metrics_.reduce();
    }
    std::string mine;
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
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

  // --- fit ----------------------------------------------------------------
  void fit() {
    const auto& t = m_.trainer;
    auto optimizer = make_optimizer(m_.optimizer, trainable_);
    const int64_t train_batches = [&] {
      const int64_t n = length(KILN_SPLIT_TRAIN);
      if (n == 0) throw HookError(data().id(), "data", "length", "the train split is empty; `kiln fit` needs samples");
      return sampler_options(KILN_SPLIT_TRAIN, t.shuffle, t.batch_size, limit_train_, n).max_batches;
    }();
    const int64_t steps_per_epoch = (train_batches + t.accumulate_grad_batches - 1) / t.accumulate_grad_batches;
    const bool per_step = m_.scheduler.interval == SchedulerInterval::step;
    int64_t total_periods = per_step ? (max_steps_ > 0 ? max_steps_ : steps_per_epoch * std::max<int64_t>(max_epochs_, 1))
                                     : std::max<int64_t>(max_epochs_, 1);
    LrSchedule schedule(m_.scheduler, m_.optimizer.lr, total_periods);
    TrainPosition start;
    if (resume_) {
      start = resume_from(*resume_, optimizer.get());
      global_step_ = start.global_step;
    }
    agree_on_start();
    open_run_dir();
    if (group_) grad_sync_ = std::make_unique<GradSync>(*group_, trainable_, trainable_names_);
    schedule.apply(*optimizer, per_step ? global_step_ : start.epoch);

    const bool validates = model().plugin().model_hooks().validation_step != nullptr && length(KILN_SPLIT_VAL) > 0 &&
                           t.check_val_every_n_epoch > 0;
    call_callbacks(&kiln_callback_hooks::on_fit_start, "on_fit_start", progress(KILN_STAGE_FIT, 0, -1));

    int64_t epoch = start.epoch;
    for (; max_epochs_ < 0 || epoch < max_epochs_; ++epoch) {
      call_callbacks(&kiln_callback_hooks::on_train_epoch_start, "on_train_epoch_start",
                     progress(KILN_STAGE_FIT, epoch, -1));
      const auto started = std::chrono::steady_clock::now();
      const BatchCursor cursor = train_epoch(epoch, *optimizer, schedule, epoch == start.epoch ? start.next_batch : 0);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::map<std::string, double> row = reduce_metrics();

      if (validates && (epoch + 1) % t.check_val_every_n_epoch == 0) {
        for (auto& [name, value] : evaluate(KILN_SPLIT_VAL, &kiln_model_hooks::validation_step, false, epoch))
          row[name] = value;
      }
      call_callbacks(&kiln_callback_hooks::on_train_epoch_end, "on_train_epoch_end",
                     progress(KILN_STAGE_FIT, epoch, -1));
      spdlog::info("epoch {}{}{}  ({:.2f} s, {:.0f} samples/s)", epoch,
                   max_epochs_ > 0 ? fmt::format("/{}", max_epochs_ - 1) : "", format_metrics(row), seconds,
                   samples_this_epoch_ / seconds);
      row["epoch"] = static_cast<double>(epoch);
      row["step"] = static_cast<double>(global_step_);
      row["epoch_seconds"] = seconds;
      if (rank() == 0) csv_.append(row);

      if (!per_step) schedule.apply(*optimizer, epoch + 1);
      // An epoch cut short (max_steps, a stop) resumes where it stopped.
      const TrainPosition next = cursor.next < cursor.total ? TrainPosition{epoch, cursor.next, global_step_}
                                                            : TrainPosition{epoch + 1, 0, global_step_};
      // Epoch checkpoints are for complete epochs; a cut-short epoch is covered
      // by the step policy (or a preemption), whose checkpoint also carries the
      // epoch's partial metrics, so a resumed epoch reports exactly.
      if (checkpointing_ && m_.checkpoint.every_n_epochs > 0 && next.next_batch == 0 &&
          (epoch + 1) % m_.checkpoint.every_n_epochs == 0)
        save_checkpoint(next, optimizer.get());
      if (agree_to_stop(stop_requested_, next, optimizer.get()) || (max_steps_ >= 0 && global_step_ >= max_steps_)) {
        ++epoch;
        break;
      }
    }
    call_callbacks(&kiln_callback_hooks::on_fit_end, "on_fit_end", progress(KILN_STAGE_FIT, epoch, -1));
    spdlog::info("fit done: {} epochs, {} steps", epoch, global_step_);

    if (t.test_after_fit && model().plugin().model_hooks().test_step) {
      auto metrics = evaluate(KILN_SPLIT_TEST, &kiln_model_hooks::test_step, false, epoch);
      metrics["epoch"] = static_cast<double>(epoch - 1);
      metrics["step"] = static_cast<double>(global_step_);
      if (rank() == 0) csv_.append(metrics);
    }
  }

  struct BatchCursor {
    int64_t next;   // the batch a resumed run would run next
    int64_t total;  // batches in the epoch
  };

  BatchCursor train_epoch(int64_t epoch, torch::optim::Optimizer& optimizer, const LrSchedule& schedule,
                          int64_t first_batch) {
    const auto& t = m_.trainer;
    Prefetcher loader = batches(KILN_SPLIT_TRAIN, epoch, t.shuffle, t.batch_size, limit_train_, first_batch);
    const auto& hooks = model().plugin().model_hooks();
    const int64_t n = static_cast<int64_t>(loader.size()) + first_batch;
    const int64_t accumulate = t.accumulate_grad_batches;
    samples_this_epoch_ = 0;
    progress_.begin(fmt::format("epoch {}", epoch), n);
    optimizer.zero_grad();
    int64_t b = first_batch;
    for (; b < n; ++b) {
      if (!group_) check_signal();  // distributed: agreed on below, with the others
      BatchPtr batch = loader.next();
      to_device(*batch);
      const int64_t rows = batch_rows(*batch);
      samples_this_epoch_ += rows * world_size();
      const bool boundary = (b + 1) % accumulate == 0 || b + 1 == n;

      if (grad_sync_) grad_sync_->before_forward();
      kiln_tensor* handle = nullptr;
      {
        InHook in(activity_, "training_step");
        model().check(hooks.training_step(model().instance(), batch.get(), b, &handle), "training_step");
      }
      if (handle == nullptr) throw HookError(model().id(), "model", "training_step", "returned no loss");
      at::Tensor loss = adopt_tensor(handle);
      if (loss.numel() != 1)
        throw HookError(model().id(), "model", "training_step",
                        fmt::format("the loss must be a scalar, got {} values", loss.numel()));
      if (!loss.requires_grad())
        throw HookError(model().id(), "model", "training_step",
                        "the loss does not require grad (was it computed under NoGradGuard or detached?)");
      const double value = loss.item<double>();
      record_metric("kiln", "train/loss", value, static_cast<double>(rows), KILN_METRIC_REDUCE_MEAN);
      at::Tensor scaled = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
      if (grad_sync_) grad_sync_->before_backward(scaled, /*sync=*/boundary);
      if (grad_sync_) {
        // The Reducer all-reduces inside backward: its failures are a peer's.
        try {
          scaled.backward();
        } catch (const c10::Error& e) {
          throw PeerFailure(std::string("gradient all-reduce failed (another rank failed or stopped responding): ") +
                            e.what_without_backtrace());
        } catch (const std::exception& e) {
          throw PeerFailure(std::string("gradient all-reduce failed (another rank failed or stopped responding): ") +
                            e.what());
        }
      } else {
        scaled.backward();
      }
      scaled = loss = at::Tensor();
      batch.reset();

      if (boundary) {
        clip_gradients();
        optimizer.step();
        optimizer.zero_grad();
        ++global_step_;
        if (schedule.per_step()) schedule.apply(optimizer, global_step_);
        call_callbacks(&kiln_callback_hooks::on_train_batch_end, "on_train_batch_end",
                       progress(KILN_STAGE_FIT, epoch, b));
      }
      progress_.step(b, value);
      bool stop = !group_ && stop_requested_.load();
      if (boundary) {
        const TrainPosition here{epoch, b + 1, global_step_};
        if (checkpointing_ && m_.checkpoint.every_n_steps > 0 && global_step_ % m_.checkpoint.every_n_steps == 0)
          save_checkpoint(here, &optimizer);
        // Distributed, the vote is one more all-reduce: every kAgreeEveryNSteps
        // optimizer steps (and at every epoch end) it is taken; all ranks count
        // steps alike, so they always vote together.
        if (!group_ || global_step_ % kAgreeEveryNSteps == 0) stop = agree_to_stop(stop_requested_, here, &optimizer);
      }
      if (stop || (max_steps_ >= 0 && global_step_ >= max_steps_)) {
        stop_requested_ = stop_requested_ || stop;
        ++b;
        break;
      }
    }
    progress_.end();
    return BatchCursor{b, n};
  }

  void clip_gradients() {
    const double clip = m_.trainer.gradient_clip_val;
    if (clip <= 0) return;
    if (m_.trainer.gradient_clip_algorithm == GradientClipAlgorithm::value)
      torch::nn::utils::clip_grad_value_(trainable_, clip);
    else
      torch::nn::utils::clip_grad_norm_(trainable_, clip);
  }

  // --- validation / test ----------------------------------------------------
  using EvalHook = decltype(&kiln_model_hooks::validation_step);

  std::map<std::string, double> evaluate(kiln_split split, EvalHook hook, bool standalone, int64_t epoch = 0) {
    const auto& t = m_.trainer;
    const bool is_val = split == KILN_SPLIT_VAL;
    const kiln_stage stage = is_val ? (standalone ? KILN_STAGE_VALIDATE : KILN_STAGE_FIT) : KILN_STAGE_TEST;
    if (length(split) == 0)
      throw HookError(data().id(), "data", "length", fmt::format("the {} split is empty", split_name(split)));
    if (is_val)
      call_callbacks(&kiln_callback_hooks::on_validation_start, "on_validation_start", progress(stage, epoch, -1));

    const char* hook_name = is_val ? "validation_step" : "test_step";
    auto step = model().plugin().model_hooks().*hook;
    {
      torch::NoGradGuard no_grad;
      Prefetcher loader = batches(split, 0, /*shuffle=*/false, t.eval_batch_size > 0 ? t.eval_batch_size : t.batch_size,
                                  is_val ? limit_val_ : limit_test_);
      const int64_t n = static_cast<int64_t>(loader.size());
      progress_.begin(split_name(split), n);
      for (int64_t b = 0; b < n; ++b) {
        check_signal();
        BatchPtr batch = loader.next();
        to_device(*batch);
        {
          InHook in(activity_, hook_name);
          model().check(step(model().instance(), batch.get(), b), hook_name);
        }
        progress_.step(b, std::nan(""));
      }
      progress_.end();
    }
    auto metrics = reduce_metrics();
    if (standalone || !is_val) spdlog::info("{}:{}", split_name(split), format_metrics(metrics));
    if (is_val)
      call_callbacks(&kiln_callback_hooks::on_validation_end, "on_validation_end", progress(stage, epoch, -1));
    else
      call_callbacks(&kiln_callback_hooks::on_test_end, "on_test_end", progress(stage, epoch, -1));
    if (standalone) {
      auto row = metrics;
      row["epoch"] = 0;
      row["step"] = static_cast<double>(global_step_);
      if (rank() == 0) csv_.append(row);
    }
    return metrics;
  }

  void predict() {
    const auto& t = m_.trainer;
    auto step = model().plugin().model_hooks().predict_step;
    std::vector<at::Tensor> outputs;
    {
      torch::NoGradGuard no_grad;
      Prefetcher loader = batches(KILN_SPLIT_PREDICT, 0, false, t.eval_batch_size > 0 ? t.eval_batch_size : t.batch_size,
                                  t.limit_predict_batches);
      const int64_t n = static_cast<int64_t>(loader.size());
      progress_.begin("predict", n);
      for (int64_t b = 0; b < n; ++b) {
        check_signal();
        BatchPtr batch = loader.next();
        to_device(*batch);
        kiln_tensor* out = nullptr;
        {
          InHook in(activity_, "predict_step");
          model().check(step(model().instance(), batch.get(), b, &out), "predict_step");
        }
        if (out == nullptr) throw HookError(model().id(), "model", "predict_step", "returned no output");
        outputs.push_back(adopt_tensor(out).cpu());
        progress_.step(b, std::nan(""));
      }
      progress_.end();
    }
    if (outputs.empty()) throw HookError(data().id(), "data", "length", "the predict split is empty");
    if (rank() != 0) return;  // predict is not sharded: rank 0 writes the whole split
    const at::Tensor all = at::cat(outputs);
    const std::vector<char> bytes = torch::pickle_save(all);
    const auto file = m_.run.dir / "predictions.pt";
    std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    spdlog::info("predict: {} rows written to {} (load with torch.load)", all.size(0), file.string());
  }

  const Manifest& m_;
  Heartbeat* heartbeat_;  // may be null
  Activity* activity_;    // may be null
  Command command_;
  const std::atomic<int>* signal_;
  const DistEnv* dist_;  // nullptr unless world size > 1
  at::Device device_;
  Progress progress_;
  CsvLog csv_;
  Session* session_ = nullptr;

  mutable std::mutex metrics_mutex_;  // data modules may record from prefetch threads
  MetricStore metrics_;
  std::atomic<bool> stop_requested_{false};

  std::unique_ptr<ProcessGroup> group_;
  NamedTensors params_, buffers_;
  bool checkpointing_ = false;
  int preempt_signal_ = 0;
  std::optional<std::filesystem::path> resume_;
  std::string resume_point_;  // the checkpoint resumed from and its position, for the agreement
  std::vector<CheckpointInfo> ranked_;
  std::unique_ptr<GradSync> grad_sync_;
  std::set<std::string> warned_metrics_;
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> trainable_names_;
  int64_t max_epochs_, max_steps_;
  BatchLimit limit_train_, limit_val_, limit_test_;
  int64_t global_step_ = 0;
  int64_t samples_this_epoch_ = 0;
};

}  // namespace

RunOutcome run(const Manifest& manifest, Command command, RunPlugins plugins, const std::atomic<int>* signal,
               const DistEnv* dist, const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat) {
  Run run(manifest, command, signal, dist, resume, heartbeat);
  return run.execute(std::move(plugins));
}

}  // namespace kiln
