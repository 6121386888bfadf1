// Test plugins that record every hook call they receive and fail on demand.
//
// One library, three plugins (a model, a data module and a callback), so the
// lifecycle tests can inject a failure at any hook of any kind and compare the
// recorded call sequence with docs/hooks.md. Config keys (all kinds):
//   log        file the calls are appended to, one "label:hook" per line
//   label      prefix of this plugin's lines (default: the kind)
//   fail_at    list of hooks that throw "injected failure in <hook>"
//   exit_at    list of hooks that call exit(0) instead
//   fail_on_rank  only fail (or exit) on this rank (default: every rank)
// In a run of several processes the label gains "@<rank>", and create also
// records "pid=<pid>", so tests can find and kill a given rank.
// Each line is appended with O_APPEND and closed at once, so a log survives
// whatever happens to the process afterwards.
#include <cstdio>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <string>

#include <kiln/plugin.hpp>

namespace {

// A data module is told rank 0 of 1 (abi.h): the recorder labels its lines
// with the launcher's RANK instead, as only a test plugin should.
int64_t launcher_env(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoll(value) : fallback;
}

// Simulates a big plugin library on slow storage: loading it takes this long.
__attribute__((constructor)) void slow_load() {
  if (const int64_t seconds = launcher_env("KILN_TEST_SLOW_LOAD_S", 0); seconds > 0) ::sleep(static_cast<unsigned>(seconds));
}

class Recorder {
 public:
  Recorder(const kiln::Host& host, kiln::Config& config, const std::string& kind)
      : log_(config.get<std::string>("log", "")), label_(config.get<std::string>("label", kind)) {
    for (const auto& hook : config.get_list<std::string>("fail_at", {})) fail_at_.insert(hook);
    for (const auto& hook : config.get_list<std::string>("exit_at", {})) exit_at_.insert(hook);
    const bool data = kind == "data";
    rank_ = data ? launcher_env("RANK", 0) : host.rank();
    const int64_t world = data ? launcher_env("WORLD_SIZE", 1) : host.world_size();
    const int64_t fail_on_rank = config.get<int64_t>("fail_on_rank", -1);
    if (fail_on_rank >= 0 && fail_on_rank != rank_) fail_at_.clear(), exit_at_.clear();
    if (world > 1) {
      label_ += "@" + std::to_string(rank_);
      record("pid=" + std::to_string(::getpid()));
    }
    if (data) record("host says rank " + std::to_string(host.rank()) + " of " + std::to_string(host.world_size()));
  }
  int64_t rank() const { return rank_; }
  // How many times the shared log holds `line` (whole line).
  int64_t logged(const std::string& line) const {
    std::ifstream in(log_);
    int64_t times = 0;
    for (std::string l; std::getline(in, l);) times += l == line;
    return times;
  }
  // Sequencing across threads and processes without timing: waits until
  // the log holds `line` `times` times. A test's own process bound ends a
  // wait that never ends; this one gives up only after ten minutes, with
  // the reason, rather than go on as if the line had come.
  void wait_until_logged(const std::string& line, int64_t times) const {
    for (int i = 0; i < 6000; ++i) {
      if (logged(line) >= times) return;
      ::usleep(100'000);
    }
    throw std::runtime_error("test recorder: waited 10 min for '" + line + "' in " + log_);
  }

  // Records the call, then fails if asked to.
  void hook(const std::string& name) const {
    record(name);
    if (exit_at_.count(name)) std::exit(0);  // a plugin that ends the process "successfully"
    if (fail_at_.count(name)) throw std::runtime_error("injected failure in " + name);
  }
  void record(const std::string& text) const {
    if (log_.empty()) return;
    const std::string line = label_ + ":" + text + "\n";
    const int fd = ::open(log_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    (void)!::write(fd, line.data(), line.size());
    ::close(fd);
  }

 private:
  std::string log_;
  std::string label_;
  std::set<std::string> fail_at_, exit_at_;
  int64_t rank_ = 0;
};

// on_exception's failure kind, as a line "<label>:failure=<NAME>".
inline std::string failure_name(kiln_failure_reason reason) {
  switch (reason) {
    case KILN_FAILURE_PLUGIN_ERROR: return "PLUGIN_ERROR";
    case KILN_FAILURE_HOST_ERROR: return "HOST_ERROR";
    case KILN_FAILURE_INTERRUPTED: return "INTERRUPTED";
    case KILN_FAILURE_PREEMPTED: return "PREEMPTED";
    case KILN_FAILURE_PEER_FAILED: return "PEER_FAILED";
  }
  return std::to_string(reason);
}

// The lifecycle hooks every kind shares, recorded the same way for all.
template <class Base>
class Recording : public Base {
 public:
  Recording(const kiln::Host& host, kiln::Config& config, const std::string& kind)
      : Base(host), recorder_(host, config, kind) {
    recorder_.hook("create");
  }
  ~Recording() override { recorder_.record("destroy"); }
  void setup(kiln::Stage) override { recorder_.hook("setup"); }
  void teardown(kiln::Stage, bool failed) override {
    recorder_.record(std::string("teardown(failed=") + (failed ? "1" : "0") + ")");
    recorder_.hook("teardown");
  }
  void on_exception(const kiln::ExceptionInfo& info) override {
    recorder_.record("on_exception(" + info.plugin_id + "/" + info.hook + ")");
    recorder_.record("failure=" + failure_name(info.reason));
    recorder_.hook("on_exception");
  }

 protected:
  Recorder recorder_;
};

// Model keys: features (4); odd_rank_outputs (a different width on odd
// ranks: a model that diverges between ranks); rank0_metric (log
// "val/rank0_only" on rank 0 alone, the pattern that hangs Lightning);
// dump_params (write the final parameters to <dump_params>.<rank> at teardown);
// buffer (register a buffer of that name: a model that differs from its
// checkpoint only in a buffer); hang_on_rank and hang_after (training_step
// on that rank never returns from step hang_after on); max_reduce_on_rank
// (log "val/mixed" reduced by max on that rank, by mean on the others);
// tensor_metrics (log the same values as tensors and as doubles, with each
// reduction: "val/tensor_<r>" and "val/double_<r>"); nan_from_step (training_step
// calls from this one on, 0-based, return a NaN loss; nan_on_rank: only there); wait_for (training_step first waits until the log holds this line;
// "{rank}" in it becomes this rank); val_wait_for and val_wait_times
// (validation_step first waits until the log holds that line that many
// times; val_wait_on_rank: only there); step_ms (each training_step sleeps this
// long: a run slow enough for a test to act on); classes (the outputs on
// even ranks, 2 by default); dump_inputs (each training_step appends its
// batch's "input" as raw float32 bytes, then its "target" as int64, to
// <dump_inputs>.<rank>: what a data module handed the model, for a test to
// compare with PyTorch's own arithmetic); rank_offset (each rank adds
// rank x this to its initial weights: ranks that start apart).
class RecorderModel : public Recording<kiln::Model> {
 public:
  RecorderModel(const kiln::Host& host, kiln::Config& config)
      : Recording(host, config, "model"),
        net_(torch::nn::Linear(config.get<int64_t>("features", 4), outputs(host, config))),
        rank0_metric_(config.get<bool>("rank0_metric", false)),
        dump_params_(config.get<std::string>("dump_params", "")),
        hang_on_rank_(config.get<int64_t>("hang_on_rank", -1)),
        hang_after_(config.get<int64_t>("hang_after", 0)),
        max_reduce_on_rank_(config.get<int64_t>("max_reduce_on_rank", -1)),
        tensor_metrics_(config.get<bool>("tensor_metrics", false)),
        wait_for_(config.get<std::string>("wait_for", "")),
        val_wait_for_(config.get<std::string>("val_wait_for", "")),
        val_wait_times_(config.get<int64_t>("val_wait_times", 1)),
        val_wait_on_rank_(config.get<int64_t>("val_wait_on_rank", -1)),
        step_ms_(config.get<int64_t>("step_ms", 0)),
        many_metrics_(config.get<int64_t>("many_metrics", 0)),
        nan_from_step_(config.get<int64_t>("nan_from_step", -1)),
        nan_on_rank_(config.get<int64_t>("nan_on_rank", -1)),
        dump_inputs_(config.get<std::string>("dump_inputs", "")) {
    if (const size_t at = wait_for_.find("{rank}"); at != std::string::npos)
      wait_for_.replace(at, 6, std::to_string(host.rank()));
    if (const std::string buffer = config.get<std::string>("buffer", ""); !buffer.empty())
      net_->register_buffer(buffer, torch::zeros({3}));
    // A parameter made without gradients, as a C++ plugin freezes one.
    if (config.get<bool>("frozen_bias", false)) net_->bias.set_requires_grad(false);
    // Initial weights that differ between ranks (a plugin seeding its own
    // generator): the start-up agreement must make rank 0's everyone's.
    if (const double offset = config.get<double>("rank_offset", 0.0); offset != 0.0) {
      torch::NoGradGuard no_grad;
      for (auto& p : net_->parameters()) p.add_(offset * static_cast<double>(host.rank()));
    }
  }
  static int64_t outputs(const kiln::Host& host, kiln::Config& config) {
    const int64_t odd = config.get<int64_t>("odd_rank_outputs", 2);
    return host.rank() % 2 == 1 ? odd : config.get<int64_t>("classes", 2);
  }
  void teardown(kiln::Stage stage, bool failed) override {
    if (!failed && !dump_params_.empty()) {
      std::ofstream out(dump_params_ + "." + std::to_string(host().rank()));
      out.precision(9);
      for (const auto& p : net_->named_parameters()) {
        out << p.key();
        const auto flat = p.value().detach().flatten();
        for (int64_t i = 0; i < flat.numel(); ++i) out << " " << flat[i].item<double>();
        out << "\n";
      }
    }
    Recording::teardown(stage, failed);
  }
  torch::nn::Module& module() override {
    recorder_.hook("parameters");
    return *net_;
  }
  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    // Waits until the log shows a line another thread writes, e.g.
    // "data:get_batch stalls".
    if (!wait_for_.empty()) recorder_.wait_until_logged(wait_for_, 1);
    recorder_.hook("training_step");
    // A slower step, so that a test can act while a run is in its loop.
    if (step_ms_ > 0) ::usleep(static_cast<useconds_t>(step_ms_ * 1000));
    if (host().rank() == hang_on_rank_ && steps_++ >= hang_after_) {
      recorder_.record("training_step hangs");
      for (;;) ::sleep(60);
    }
    if (!dump_inputs_.empty()) {
      std::ofstream out(dump_inputs_ + "." + std::to_string(host().rank()), std::ios::binary | std::ios::app);
      const at::Tensor input = batch["input"].to(torch::kCPU, torch::kFloat).contiguous();
      const at::Tensor target = batch["target"].to(torch::kCPU, torch::kLong).contiguous();
      out.write(static_cast<const char*>(input.data_ptr()), static_cast<std::streamsize>(input.nbytes()));
      out.write(static_cast<const char*>(target.data_ptr()), static_cast<std::streamsize>(target.nbytes()));
    }
    at::Tensor loss = torch::nn::functional::cross_entropy(net_->forward(batch["input"]), batch["target"]);
    if (nan_from_step_ >= 0 && calls_++ >= nan_from_step_ && (nan_on_rank_ < 0 || nan_on_rank_ == host().rank()))
      loss = loss * std::numeric_limits<double>::quiet_NaN();  // a loss gone bad: NaN gradients follow
    return loss;
  }
  void validation_step(const kiln::Batch& batch, int64_t b) override {
    if (!val_wait_for_.empty() && (val_wait_on_rank_ < 0 || val_wait_on_rank_ == host().rank()))
      recorder_.wait_until_logged(val_wait_for_, val_wait_times_);
    recorder_.hook("validation_step");
    const at::Tensor target = batch["target"];
    host().log_metric("val/loss", torch::nn::functional::cross_entropy(net_->forward(batch["input"]), target).item<double>(),
                      static_cast<double>(target.size(0)));
    if (tensor_metrics_) log_both_ways(batch, b);
    for (int64_t i = 0; i < many_metrics_; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "many/m%05lld", static_cast<long long>(i));
      host().log_metric(name, static_cast<double>(i) / 7.0 + static_cast<double>(b));
    }
    if (max_reduce_on_rank_ >= 0)
      host().log_metric("val/mixed", 1.0, 1.0,
                        host().rank() == max_reduce_on_rank_ ? KILN_METRIC_REDUCE_MAX : KILN_METRIC_REDUCE_MEAN);
    if (rank0_metric_ && host().rank() == 0) {
      host().log_metric("val/rank0_only", 1.0);  // the Lightning deadlock pattern
      host().log_metric("val/rank0_flagged", 2.0, 1.0, KILN_METRIC_RANK_ZERO_ONLY);  // the sanctioned way
    }
  }
  void test_step(const kiln::Batch&, int64_t) override { recorder_.hook("test_step"); }

 private:
  // The same values through both paths (ABI 1.1's log_metric_tensor and
  // log_metric), for every reduction: metrics.csv must show them equal.
  void log_both_ways(const kiln::Batch& batch, int64_t b) {
    const at::Tensor input = batch["input"];
    const double rows = static_cast<double>(input.size(0));
    // One value, computed once in float64, so that metrics.csv can show the
    // two paths equal to the last digit, not merely close.
    const at::Tensor tensor = input.mean().to(at::kDouble) + static_cast<double>(b + host().rank());
    const double value = tensor.item<double>();
    for (const auto& [reduce, name] : {std::pair{KILN_METRIC_REDUCE_MEAN, "mean"}, std::pair{KILN_METRIC_REDUCE_SUM, "sum"},
                                       std::pair{KILN_METRIC_REDUCE_MAX, "max"}, std::pair{KILN_METRIC_REDUCE_MIN, "min"}}) {
      host().log_metric(std::string("val/tensor_") + name, tensor, rows, reduce);
      host().log_metric(std::string("val/double_") + name, value, rows, reduce);
    }
  }

  torch::nn::Linear net_;
  bool rank0_metric_;
  bool tensor_metrics_;
  std::string dump_params_;
  int64_t hang_on_rank_, hang_after_, max_reduce_on_rank_;
  std::string wait_for_;
  std::string val_wait_for_;
  int64_t val_wait_times_;
  int64_t val_wait_on_rank_;
  int64_t step_ms_;
  int64_t many_metrics_;  // validation logs this many more metrics (an MLflow batch's limits)
  int64_t nan_from_step_, nan_on_rank_;
  std::string dump_inputs_;
  int64_t steps_ = 0, calls_ = 0;
};

// Data keys: size (16), features (4); odd_rank_size (a different length on
// odd launcher ranks: node-local data that differs); stall_after and stall_s
// (get_batch calls from number stall_after on sleep stall_s seconds, a data
// source that hangs).
class RecorderData : public Recording<kiln::DataModule> {
 public:
  RecorderData(const kiln::Host& host, kiln::Config& config)
      : Recording(host, config, "data"),
        size_(config.get<int64_t>("size", 16)),
        features_(config.get<int64_t>("features", 4)),
        stall_after_(config.get<int64_t>("stall_after", -1)),
        stall_s_(config.get<int64_t>("stall_s", 0)) {
    const int64_t odd_rank_size = config.get<int64_t>("odd_rank_size", size_);
    if (recorder_.rank() % 2 == 1) size_ = odd_rank_size;
  }
  void prepare_data() override { recorder_.hook("prepare_data"); }
  int64_t length(kiln::Split) override {
    recorder_.hook("length");
    return size_;
  }
  kiln::TensorMap get_batch(kiln::Split, const int64_t* indices, size_t count) override {
    if (stall_after_ >= 0 && calls_++ >= stall_after_) {
      recorder_.record("get_batch stalls");
      ::sleep(static_cast<unsigned>(stall_s_));
    }
    recorder_.hook("get_batch");
    auto index = torch::from_blob(const_cast<int64_t*>(indices), {static_cast<int64_t>(count)}, torch::kLong).clone();
    auto input = (index.to(torch::kFloat).unsqueeze(1) / size_).repeat({1, features_});
    return {{"input", input}, {"target", index.remainder(2)}};
  }

 private:
  int64_t size_;
  int64_t features_;
  int64_t stall_after_, stall_s_;
  std::atomic<int64_t> calls_{0};
};

// Callback keys: stop_after_epoch and stop_on_rank: request a stop at the end
// of that epoch on that rank only; the host must make every rank agree.
// save_ms: its state_save (inside every checkpoint commit, on rank 0) takes
// this long, logging "state_save starts" and "state_save ends": a slow commit.
// The ways a fit is stopped from outside, each at a chosen optimizer step
// (on_train_batch_end, every rank): signal_at_step and signal ("SIGTERM",
// "SIGINT" or "SIGUSR1") and signal_to ("self", or "launcher": the parent,
// kiln's supervisor under `kiln fit -n N`, which forwards it to every rank
// as a terminal's Ctrl-C or a scheduler's signal reaches it); crash_at_step
// and crash_marker: rank 0 dies of SIGKILL there, once (the marker file,
// created first, says it did); batch_end_ms: each on_train_batch_end sleeps
// this long (a run slow enough for max_time to end it inside an epoch).
class RecorderCallback : public Recording<kiln::Callback> {
 public:
  RecorderCallback(const kiln::Host& host, kiln::Config& config)
      : Recording(host, config, "callback"),
        stop_after_epoch_(config.get<int64_t>("stop_after_epoch", -1)),
        stop_on_rank_(config.get<int64_t>("stop_on_rank", 0)),
        save_ms_(config.get<int64_t>("save_ms", 0)),
        signal_at_step_(config.get<int64_t>("signal_at_step", -1)),
        signal_(signal_number(config.get<std::string>("signal", "SIGTERM"))),
        signal_launcher_(config.get<std::string>("signal_to", "self") == "launcher"),
        crash_at_step_(config.get<int64_t>("crash_at_step", -1)),
        crash_marker_(config.get<std::string>("crash_marker", "")),
        batch_end_ms_(config.get<int64_t>("batch_end_ms", 0)) {}
  void state_save(kiln::StateWriter&) override {
    if (save_ms_ <= 0) return;
    recorder_.record("state_save starts");
    ::usleep(static_cast<useconds_t>(save_ms_ * 1000));
    recorder_.record("state_save ends");
  }
  void on_fit_start(const kiln_progress&) override { recorder_.hook("on_fit_start"); }
  void on_fit_end(const kiln_progress&) override { recorder_.hook("on_fit_end"); }
  void on_train_epoch_start(const kiln_progress&) override { recorder_.hook("on_train_epoch_start"); }
  void on_train_epoch_end(const kiln_progress& p) override {
    recorder_.hook("on_train_epoch_end");
    if (p.epoch == stop_after_epoch_ && host().rank() == stop_on_rank_) host().request_stop("recorder asked to stop");
  }
  void on_train_batch_end(const kiln_progress& p) override {
    recorder_.hook("on_train_batch_end");
    if (batch_end_ms_ > 0) ::usleep(static_cast<useconds_t>(batch_end_ms_ * 1000));
    // To the process, not the thread (raise): kiln's signal watcher waits
    // for process-directed signals. The launcher's is sent by rank 0 alone.
    if (p.global_step == signal_at_step_ && (!signal_launcher_ || host().rank() == 0))
      ::kill(signal_launcher_ ? ::getppid() : ::getpid(), signal_);
    if (p.global_step == crash_at_step_ && host().rank() == 0 && !crash_marker_.empty() &&
        ::access(crash_marker_.c_str(), F_OK) != 0) {
      const int fd = ::open(crash_marker_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd);
      recorder_.record("crashes");
      ::kill(::getpid(), SIGKILL);
    }
  }
  void on_validation_start(const kiln_progress&) override { recorder_.hook("on_validation_start"); }
  void on_validation_end(const kiln_progress&) override { recorder_.hook("on_validation_end"); }
  void on_test_end(const kiln_progress&) override { recorder_.hook("on_test_end"); }

 private:
  static int signal_number(const std::string& name) {
    if (name == "SIGTERM") return SIGTERM;
    if (name == "SIGINT") return SIGINT;
    if (name == "SIGUSR1") return SIGUSR1;
    throw kiln::ConfigError("'signal' must be SIGTERM, SIGINT or SIGUSR1, not '" + name + "'");
  }

  int64_t stop_after_epoch_;
  int64_t stop_on_rank_;
  int64_t save_ms_;
  int64_t signal_at_step_;
  int signal_;
  bool signal_launcher_;
  int64_t crash_at_step_;
  std::string crash_marker_;
  int64_t batch_end_ms_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<RecorderModel>({"test.recorder_model", "recorder model", "1"}),
                    kiln::describe<RecorderData>({"test.recorder_data", "recorder data", "1"}),
                    kiln::describe<RecorderCallback>({"test.recorder_callback", "recorder callback", "1"}))
