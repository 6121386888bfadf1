#include "metrics/mlflow_logger.hpp"

#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "config/logger_registry.hpp"
#include "util/errors.hpp"
#include "util/run_dir_lock.hpp"
#include "util/shortest_double.hpp"

namespace kiln {

namespace {

// Set by the start-up check (in this process, or in the supervisor that
// started it) once it has warned that the server cannot be reached: the
// background thread's first failure then says nothing more.
constexpr const char* kWarnedVariable = "KILN_MLFLOW_UNREACHABLE_AT_START";

// How long one request may take; the thread's wait between sends.
constexpr double kRequestTimeoutS = 15.0;
constexpr auto kSendInterval = std::chrono::milliseconds(1000);
constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);
// Unsent bytes that wake the thread before its interval (about 1,000 points).
constexpr int64_t kWakeBytes = 64 * 1024;
// The writer thread's interval, and the queued points that wake it sooner.
constexpr size_t kWakeWriterPoints = 16 * 1024;
constexpr auto kWriteInterval = std::chrono::milliseconds(250);
// MLflow's longest param value (6,000 characters since MLflow 2).
constexpr size_t kMaxParamValue = 6000;

std::string tracking_uri_of(const MlflowConfig& config) {
  if (!config.tracking_uri.empty()) return config.tracking_uri;
  const char* env = std::getenv("MLFLOW_TRACKING_URI");
  return env ? env : "";
}

std::string status_name(RunEnd::Status s) {
  switch (s) {
    case RunEnd::Status::finished: return "FINISHED";
    case RunEnd::Status::failed: return "FAILED";
    case RunEnd::Status::killed: return "KILLED";
  }
  return "FAILED";
}

std::string param_value(const HParam& h) {
  switch (h.kind) {
    case HParam::Kind::number:
      if (std::isfinite(h.number) && h.number == std::trunc(h.number) && std::fabs(h.number) < 1e15)
        return std::to_string(static_cast<int64_t>(h.number));
      return std::isfinite(h.number) ? python_float_repr(h.number) : shortest_double(h.number);
    case HParam::Kind::boolean: return h.boolean ? "true" : "false";
    case HParam::Kind::string: return h.string;
  }
  return h.string;
}

std::string points_phrase(int64_t n) { return std::to_string(n) + (n == 1 ? " record" : " records"); }

}  // namespace

MlflowLogger::MlflowLogger(const MlflowConfig& config, std::string tracking_uri, const std::filesystem::path& run_dir,
                           bool evaluates_the_fit)
    : config_(config),
      uri_(std::move(tracking_uri)),
      run_dir_(run_dir),
      files_(run_dir),
      evaluates_the_fit_(evaluates_the_fit) {}

MlflowLogger::~MlflowLogger() {
  // Not finished (a failure before the end): what is queued still goes to the spool.
  stop_writer();
  try {
    if (spool_) write_queued();
  } catch (const std::exception&) {
  }
  stop_thread();
}

void MlflowLogger::open(const std::string& state) {
  std::filesystem::create_directories(files_.dir);
  MlflowRunInfo info;
  info.tracking_uri = uri_;
  info.experiment = config_.experiment;
  info.run_name = config_.run_name.empty() ? run_dir_.filename().string() : config_.run_name;
  info.tags = config_.tags;
  info.tags.emplace("kiln.run_dir", std::filesystem::absolute(run_dir_).lexically_normal().string());
  std::optional<MlflowRunInfo> fit;
  if (state.empty() && evaluates_the_fit_) fit = fits_run();
  if (fit) {
    // The fit's run goes on: its spool grows past the fit's end record (the
    // server may still be owed some of it: sent with these), and the params
    // stay the fit's (MLflow's params cannot change).
    info = *fit;
    std::error_code ec;
    const auto size = std::filesystem::file_size(files_.spool(), ec);
    spool_.emplace(files_.spool(), ec ? -1 : static_cast<int64_t>(size));
    spdlog::info("MLflow: logging into run {} at {}, the one this directory's fit logged to",
                 info.run_id.empty() ? "(not created yet: the fit never reached the server)" : info.run_id, uri_);
  } else if (state.empty()) {
    // A new run: a new MLflow run, its params first in the spool. What an
    // earlier run in this directory had not sent is kept aside, not lost.
    keep_unsent_spool();
    std::error_code ignored;
    std::filesystem::remove(files_.acked(), ignored);
    files_.write_run_info(info);
    spool_.emplace(files_.spool(), -1);
    std::string params;
    for (const HParam& h : hparams_) {
      std::string value = param_value(h);
      if (value.size() > kMaxParamValue) value.resize(kMaxParamValue);
      params += spool_param(h.name, value);
    }
    if (!params.empty()) spool_->append(params);
  } else {
    const size_t space = state.find(' ');
    int64_t length = -1;
    try {
      length = std::stoll(state.substr(0, space));
    } catch (const std::exception&) {
    }
    if (length < 0 || space == std::string::npos)
      throw std::runtime_error("checkpoint holds a malformed state for the mlflow logger: '" + state + "'");
    const std::string id = state.substr(space + 1);
    // The points the stopped run spooled after its checkpoint: the resumed
    // run recomputes them, and sends them with the same timestamps.
    std::error_code ec;
    const auto size = std::filesystem::file_size(files_.spool(), ec);
    if (!ec && static_cast<int64_t>(size) > length)
      earlier_points_ = spooled_points(read_range(files_.spool(), length, static_cast<int64_t>(size)));
    if (auto earlier = files_.read_run_info()) info.run_id = earlier->run_id;
    if (id != "-") info.run_id = id;
    files_.write_run_info(info);
    spool_.emplace(files_.spool(), length);
    if (!spool_->continued_whole())
      spdlog::warn("{} is shorter than the checkpoint recorded; MLflow points from before the checkpoint that were "
                   "not sent are lost",
                   files_.spool().string());
    if (files_.read_acked() > spool_->size()) files_.write_acked(spool_->size());
  }
  run_id_ = info.run_id;
  published_ = spool_->size();
  notified_at_ = spool_->size();
  writer_ = std::thread([this] { write_in_background(); });
  thread_ = std::thread([this] { ship_in_background(); });
}

std::optional<MlflowRunInfo> MlflowLogger::fits_run() const {
  std::optional<MlflowRunInfo> fit;
  try {
    fit = files_.read_run_info();
  } catch (const std::exception& e) {
    spdlog::warn("MLflow: {} cannot be read ({}): this run logs to a new MLflow run", files_.run_info().string(),
                 e.what());
    return std::nullopt;
  }
  if (!fit) return std::nullopt;
  if (fit->tracking_uri != uri_ || fit->experiment != config_.experiment) {
    spdlog::info("MLflow: this directory's fit logged to experiment '{}' at {}; this run logs to experiment '{}' at "
                 "{}: a new MLflow run",
                 fit->experiment, fit->tracking_uri, config_.experiment, uri_);
    return std::nullopt;
  }
  return fit;
}

void MlflowLogger::keep_unsent_spool() {
  std::error_code ec;
  const auto size = std::filesystem::file_size(files_.spool(), ec);
  if (ec || static_cast<int64_t>(size) <= files_.read_acked()) return;
  const int64_t left = spool_records(read_range(files_.spool(), files_.read_acked(), static_cast<int64_t>(size)));
  if (left == 0) return;
  const std::filesystem::path kept = run_dir_ / ("mlflow-unsent-" + std::to_string(now_ms()));
  std::filesystem::rename(files_.dir, kept);
  std::filesystem::create_directories(files_.dir);
  spdlog::warn("an earlier run in {} had {} not sent to MLflow: kept in {}; send them with `kiln mlflow-sync {}`",
               run_dir_.string(), points_phrase(left), kept.string(), kept.string());
}

const MlflowLogger::Key& MlflowLogger::metric_key(const std::string& name) {
  const auto it = keys_.find(name);
  if (it != keys_.end()) return it->second;
  // MLflow's metric names: letters, digits, _ - . / and spaces.
  std::string key = name;
  for (char& c : key)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/' || c == ' '))
      c = '_';
  if (key != name) spdlog::warn("MLflow does not take the metric name '{}': it is logged there as '{}'", name, key);
  Key made{key, spool_metric_prefix(key)};
  return keys_.emplace(name, std::move(made)).first->second;
}

void MlflowLogger::log(const LogRow& row) {
  if (!spool_) return;
  const int64_t now = now_ms();
  // Runs every step at log_every_n_steps = 1: the points are queued as they
  // are (a pointer and three numbers each); the writer thread formats them.
  std::unique_lock lock(queue_mutex_);
  if (write_error_) std::rethrow_exception(write_error_);
  auto point = [&](const std::string& name, double value) {
    const Key& key = metric_key(name);
    if (!earlier_points_.empty()) {
      const auto it = earlier_points_.find({key.key, row.step});
      if (it != earlier_points_.end()) {
        recomputed_differently_ += it->second.value != spool_value(value);
        queue_.push_back({&key, value, row.step, it->second.timestamp_ms,
                          spool_metric_text(key.key, it->second.value, row.step, it->second.timestamp_ms)});
        earlier_points_.erase(it);
        return;
      }
    }
    queue_.push_back({&key, value, row.step, now, {}});
  };
  // An epoch row carries `epoch`, as Lightning's loggers log it.
  if (row.kind == LogRow::Kind::epoch) point("epoch", static_cast<double>(row.epoch));
  for (const auto& [name, value] : row.metrics) point(name, value);
  const bool many = queue_.size() >= kWakeWriterPoints;
  lock.unlock();
  if (many) queue_cv_.notify_one();
}

void MlflowLogger::write_in_background() {
  pthread_setname_np(pthread_self(), "mlflow-spool");  // named in top, perf and gdb
  std::unique_lock lock(queue_mutex_);
  while (!writer_stopping_) {
    queue_cv_.wait_for(lock, kWriteInterval, [&] { return writer_stopping_ || queue_.size() >= kWakeWriterPoints; });
    if (writer_stopping_ || write_error_ || queue_.empty()) continue;
    lock.unlock();
    try {
      write_queued();
      lock.lock();
    } catch (...) {
      // log() says it on the training's thread (a full disk is the run's error).
      lock.lock();
      write_error_ = std::current_exception();
    }
  }
}

void MlflowLogger::stop_writer() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lock(queue_mutex_);
    writer_stopping_ = true;
  }
  queue_cv_.notify_one();
  writer_.join();
}

void MlflowLogger::write_queued() {
  std::unique_lock spool_lock(spool_mutex_);
  write_queued(spool_lock);
}

void MlflowLogger::write_queued(const std::unique_lock<std::mutex>&) {
  // Taken while spool_mutex_ is held: a batch taken is written before any
  // later one, whichever thread writes it.
  {
    std::lock_guard lock(queue_mutex_);
    writing_.swap(queue_);
  }
  if (writing_.empty()) return;
  text_.clear();
  for (const QueuedPoint& p : writing_) {
    if (!p.line.empty())
      text_ += p.line;
    else
      append_spool_metric(text_, p.key->prefix, p.value, p.step, p.timestamp_ms);
  }
  writing_.clear();
  spool_->append(text_);
  published_.store(spool_->size(), std::memory_order_release);
  if (spool_->size() - notified_at_ >= kWakeBytes) {
    notified_at_ = spool_->size();
    wake_.notify_one();
  }
}

void MlflowLogger::flush() {
  if (!spool_) return;
  std::unique_lock spool_lock(spool_mutex_);
  write_queued(spool_lock);
  spool_->sync();
}

std::string MlflowLogger::state() {
  if (!spool_) return "";
  std::unique_lock spool_lock(spool_mutex_);
  write_queued(spool_lock);
  spool_->sync();
  const int64_t size = spool_->size();
  std::lock_guard lock(mutex_);
  return std::to_string(size) + " " + (run_id_.empty() ? "-" : run_id_);
}

void MlflowLogger::ship_in_background() {
  pthread_setname_np(pthread_self(), "mlflow-send");
  std::optional<MlflowClient> client;
  std::optional<MlflowShipper> shipper;
  bool down = false;
  bool quiet = std::getenv(kWarnedVariable) != nullptr;  // the start-up check has warned already
  auto backoff = std::chrono::milliseconds(500);
  std::unique_lock lock(mutex_);
  while (true) {
    const int64_t end = published_.load(std::memory_order_acquire);
    lock.unlock();
    bool ok = true;
    std::string error;
    try {
      if (!client) client.emplace(uri_, kRequestTimeoutS);
      if (!shipper) shipper.emplace(files_, *client);
      shipper->ship(end);
    } catch (const MlflowError& e) {
      ok = false;
      error = e.what();
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
    lock.lock();
    if (shipper) {
      run_id_ = shipper->run_id().empty() ? run_id_ : shipper->run_id();
      acked_ = shipper->acked();
      if (shipper->refused() > refused_) {
        spdlog::warn("the MLflow server refused {} (kept out of the run; the server said: {})",
                     points_phrase(shipper->refused() - refused_), shipper->last_refusal());
        refused_ = shipper->refused();
      }
    }
    if (ok) {
      if (down) spdlog::info("the MLflow server at {} answers again; the spool is being sent", uri_);
      down = false;
      last_error_.clear();
      backoff = std::chrono::milliseconds(500);
    } else {
      if (!down && !quiet)
        spdlog::warn("MLflow: {}; training goes on, the points wait in {} and are sent when the server answers",
                     error, files_.spool().string());
      down = true;
      quiet = false;
      last_error_ = error;
    }
    const bool drained = ok && acked_ >= published_.load(std::memory_order_acquire);
    if (stopping_ && (drained || std::chrono::steady_clock::now() >= deadline_)) return;
    const auto wait = ok ? std::chrono::milliseconds(kSendInterval) : backoff;
    if (!ok) backoff = std::min(backoff * 2, std::chrono::milliseconds(kMaxBackoff));
    const auto until = stopping_ ? std::min(std::chrono::steady_clock::now() + wait, deadline_)
                                 : std::chrono::steady_clock::now() + wait;
    // Woken early by volume, or by finish(): the spool is sent at once.
    const int64_t seen = end;
    wake_.wait_until(lock, until, [&] {
      return stopping_ ? ok && acked_ < published_.load() : published_.load() - seen >= kWakeBytes;
    });
  }
}

void MlflowLogger::stop_thread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      deadline_ = std::chrono::steady_clock::now();
    }
  }
  wake_.notify_one();
  thread_.join();
}

void MlflowLogger::finish(const RunEnd& end) {
  if (!spool_) return;
  stop_writer();
  std::string lines;
  if (!end.final_checkpoint.empty())
    lines += spool_tag("kiln.final_checkpoint", std::filesystem::absolute(end.final_checkpoint).lexically_normal().string());
  lines += spool_end(status_name(end.status), now_ms());
  {
    std::unique_lock spool_lock(spool_mutex_);
    write_queued(spool_lock);
    spool_->append(lines);
    published_.store(spool_->size(), std::memory_order_release);
  }
  if (recomputed_differently_ > 0)
    spdlog::info("MLflow keeps the first value of {} point(s) the stopped run had logged and this one recomputed "
                 "otherwise (timing metrics: kiln's resume recomputes the others bit for bit)",
                 recomputed_differently_);
  spool_->sync();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(config_.finish_timeout_s * 1000));
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  const int64_t left = spool_records(read_range(files_.spool(), acked_, spool_->size()));
  if (left > 0)
    spdlog::warn("MLflow: {} not sent to {} ({}); they are kept in {}: send them with `kiln mlflow-sync {}`", points_phrase(left),
                 uri_, last_error_.empty() ? "the server was still taking them" : last_error_,
                 files_.spool().string(), run_dir_.string());
  else
    spdlog::info("MLflow: run {} at {} has every point ({})", run_id_, uri_, status_name(end.status));
}

std::unique_ptr<Logger> make_mlflow_logger(const LoggerContext& context) {
  auto logger = std::make_unique<MlflowLogger>(context.config.mlflow, tracking_uri_of(context.config.mlflow),
                                               context.run_dir, context.evaluates_the_fit);
  if (context.hparams) logger->set_hparams(*context.hparams);  // the manifest, flattened: the run's params
  return logger;
}

void check_mlflow_server(const LoggerContext& context) {
  const MlflowConfig& config = context.config.mlflow;
  const std::string uri = tracking_uri_of(config);
  if (uri.empty())
    throw InputError("logging.loggers names \"mlflow\" but no server: set logging.mlflow.tracking_uri (e.g. "
                     "\"http://127.0.0.1:5000\") or MLFLOW_TRACKING_URI");
  if (config.tracking_uri.empty() && uri.rfind("http://", 0) != 0 && uri.rfind("https://", 0) != 0)
    throw InputError("MLFLOW_TRACKING_URI must be an http:// or https:// address for kiln's mlflow logger, not '" +
                     uri + "' (set logging.mlflow.tracking_uri)");
  std::string problem;
  try {
    MlflowClient client(uri, 10.0);
    client.experiment_id(config.experiment);
    return;
  } catch (const MlflowError& e) {
    switch (e.kind()) {
      case MlflowError::Kind::login:
        problem = "the MLflow server at " + uri + " refused the login or the experiment '" + config.experiment +
                  "' (" + e.what() + "): set MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD to an "
                  "account that may write to it";
        break;
      case MlflowError::Kind::refused:
        throw InputError("the MLflow server at " + uri + " refused the experiment '" + config.experiment + "': " +
                         e.what() + " (check logging.mlflow.experiment)");
      default:
        problem = "cannot reach the MLflow server at " + uri + " (" + e.what() + ")";
    }
  }
  if (config.required)
    throw InputError(problem + "; start it or fix logging.mlflow.tracking_uri, or set logging.mlflow.required = "
                               "false to train now and send the points later");
  spdlog::warn("{}; training goes on (logging.mlflow.required = false): the points wait in {} and are sent when the "
               "server answers",
               problem, MlflowFiles(context.run_dir).spool().string());
  ::setenv(kWarnedVariable, "1", 1);
}

int mlflow_sync(const std::filesystem::path& run_dir, double timeout_s) {
  // A run directory, or a spool kept aside (mlflow-unsent-*) itself.
  const MlflowFiles files = std::filesystem::exists(run_dir / "run.json") ? MlflowFiles::in(run_dir) : MlflowFiles(run_dir);
  const auto info = files.read_run_info();
  std::error_code ec;
  const auto size = std::filesystem::file_size(files.spool(), ec);
  if (!info || ec)
    throw InputError(run_dir.string() + " has no MLflow spool (mlflow/run.json, mlflow/spool.jsonl): it was not "
                     "trained with the mlflow logger");
  // Not beside a run that is still writing the spool.
  lock_existing_run_dir(run_dir);
  MlflowClient client(info->tracking_uri, kRequestTimeoutS);
  MlflowShipper shipper(files, client);
  const int64_t end = static_cast<int64_t>(size);
  const int64_t before = spool_records(read_range(files.spool(), std::min(shipper.acked(), end), end));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto backoff = std::chrono::milliseconds(500);
  std::string error;
  while (true) {
    try {
      shipper.ship(end);
      error.clear();
      break;
    } catch (const MlflowError& e) {
      error = e.what();
      if (!e.worth_retrying() && e.kind() != MlflowError::Kind::login) break;
    }
    if (std::chrono::steady_clock::now() + backoff > deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(kMaxBackoff));
  }
  const int64_t left = spool_records(read_range(files.spool(), std::min(shipper.acked(), end), end));
  if (shipper.refused() > 0)
    spdlog::warn("the MLflow server refused {} (the server said: {})", points_phrase(shipper.refused()),
                 shipper.last_refusal());
  if (left > 0) {
    spdlog::error("{} of {} still not sent to {}: {}; run `kiln mlflow-sync {}` again", points_phrase(left),
                  points_phrase(before), info->tracking_uri, error, run_dir.string());
    return 1;
  }
  spdlog::info("sent {} to MLflow run {} at {}; nothing is left in {}", points_phrase(before), shipper.run_id(),
               info->tracking_uri, files.spool().string());
  return 0;
}

}  // namespace kiln
