// The "mlflow" logger: the run's params, metrics and end in an MLflow
// tracking server ([logging.mlflow]; docs/logging.md, "MLflow").
//
// Nothing it does waits on the server. log() queues the row's points (a
// key, a double, a step and a time each: no formatting on the training's
// thread) and returns; a writer thread turns them into spool lines
// (metrics/mlflow_spool.hpp) every 250 ms, and checkpoints, flush() and the
// end write what is queued at once; a sender thread sends the spool's unsent
// part in log-batch requests, about once a second, retrying with backoff
// while the server is away. The spool is the queue: it holds what the server
// has not acknowledged, on disk, so memory stays bounded however long the
// server is gone, and a crash loses nothing a checkpoint counted.
//
// Resume: the checkpoint keeps the spool's length and the MLflow run id; a
// resumed run continues the same MLflow run, cuts the spool back to that
// length (as metrics.jsonl is), and gives each point it recomputes the
// timestamp the spool had for that key and step, so the server, which keeps
// one point per (key, step, timestamp, value), keeps each point once.
//
// The end: finish() spools the final checkpoint's path as a tag and the
// status (FINISHED, FAILED, KILLED), then waits up to finish_timeout_s for
// the server to take everything; what is left is reported with the command
// that sends it (`kiln mlflow-sync <run dir>`).
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/manifest.hpp"
#include "metrics/logger.hpp"
#include "metrics/mlflow_spool.hpp"
#include "util/append_file.hpp"

namespace kiln {

class MlflowLogger final : public Logger {
 public:
  // `tracking_uri`: resolved (the manifest's, or MLFLOW_TRACKING_URI).
  // `evaluates_the_fit` (`kiln validate` / `kiln test`): a logger opened
  // afresh logs into the MLflow run of the fit in `run_dir` (mlflow/run.json)
  // when it logged to the same server and experiment.
  MlflowLogger(const MlflowConfig& config, std::string tracking_uri, const std::filesystem::path& run_dir,
               bool evaluates_the_fit = false);
  ~MlflowLogger() override;
  const char* name() const override { return "mlflow"; }
  void set_hparams(const std::vector<HParam>& hparams) override { hparams_ = hparams; }
  void open(const std::string& state) override;
  void log(const LogRow& row) override;
  void flush() override;
  // "<spool length> <run id>" (the id "-" while the server has not made it).
  std::string state() override;
  void finish(const RunEnd& end) override;

 private:
  // A metric's MLflow key, and its spool line's start ({"m":"<key>","v":).
  struct Key {
    std::string key;
    std::string prefix;
  };
  // A point as log() queues it: `line` holds the spool line when log() made
  // it already (a resumed run's recomputed point), else it is made from
  // the rest by the writer.
  struct QueuedPoint {
    const Key* key = nullptr;  // a node of keys_: stable, never changed once made
    double value = 0;
    int64_t step = 0;
    int64_t timestamp_ms = 0;
    std::string line;
  };
  // The queued points into the spool, in order: under spool_mutex_.
  void write_queued(const std::unique_lock<std::mutex>& spool_lock);
  void write_queued();
  void write_in_background();
  void stop_writer();
  void keep_unsent_spool();
  // The run the directory's fit logged to, when this one continues it.
  std::optional<MlflowRunInfo> fits_run() const;
  void ship_in_background();
  void stop_thread();
  const Key& metric_key(const std::string& name);

  MlflowConfig config_;
  std::string uri_;
  std::filesystem::path run_dir_;
  MlflowFiles files_;
  std::vector<HParam> hparams_;
  const bool evaluates_the_fit_;
  std::optional<AppendFile> spool_;
  // What log() queued and the writer has not written yet: written every
  // 250 ms (a write a row would cost a step-bound run more than 1 %), and
  // always before a checkpoint records the spool's length. A crash loses
  // only points after the last checkpoint, which a resume recomputes.
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::vector<QueuedPoint> queue_;       // under queue_mutex_
  bool writer_stopping_ = false;         // under queue_mutex_
  std::exception_ptr write_error_;       // under queue_mutex_: the writer's, rethrown by log()
  std::mutex spool_mutex_;               // spool_, writing_ and notified_at_: one writer at a time, in order
  std::vector<QueuedPoint> writing_;     // the taken queue (its capacity kept)
  std::string text_;                     // its lines
  std::thread writer_;
  // (key, step) -> the point the stopped run spooled after its checkpoint,
  // which this resumed run recomputes: sent as it was first (the server may
  // have it), so the server keeps one point.
  std::map<std::pair<std::string, int64_t>, SpooledPoint> earlier_points_;
  int64_t recomputed_differently_ = 0;  // of those, how many this run computed otherwise (timing metrics)
  std::map<std::string, Key> keys_;  // metric name -> MLflow key (invalid characters replaced)

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int64_t> published_{0};  // spool bytes whole lines reach
  int64_t notified_at_ = 0;            // published_ when the thread was last woken for volume (spool_mutex_)
  bool stopping_ = false;              // finish() or the destructor
  std::chrono::steady_clock::time_point deadline_;
  // What the thread learnt, under mutex_.
  std::string run_id_;
  int64_t acked_ = 0;
  int64_t refused_ = 0;
  std::string last_error_;
};

// `kiln mlflow-sync <run dir>`: sends what a run's spool still holds,
// retrying for up to `timeout_s`. Returns the process's exit code (0: nothing
// left; 1: points still unsent, said in one line); throws InputError for a
// directory with no MLflow spool.
int mlflow_sync(const std::filesystem::path& run_dir, double timeout_s);

}  // namespace kiln
