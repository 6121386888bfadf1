// Where logged metrics go: one Logger per file format ([logging] loggers in
// the manifest; docs/logging.md). The run hands each row to every logger
// (metrics/loggers.hpp, the fan-out) on rank 0 only.
//
// Rows: an epoch row at the end of each training epoch (and one for a
// test/validate run, and for test_after_fit), holding the epoch's reduced
// metrics; a step row every trainer.log_every_n_steps optimizer steps, with
// the step-level values (train/loss_step and the monitors, train/monitors).
//
// Resume: a checkpoint keeps each logger's state(); a resumed run passes it
// back to open(), and the logger continues its file exactly after the last
// row the checkpoint had seen, so no row is lost or written twice.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/hparams.hpp"

namespace kiln {

struct LogRow {
  enum class Kind { step, epoch };
  Kind kind = Kind::epoch;
  int64_t epoch = 0;
  int64_t step = 0;  // optimizer steps taken so far (global)
  std::map<std::string, double> metrics;  // without "epoch" and "step"
  // An epoch row of an epoch a stop cut short (max_steps, max_time, a
  // callback's stop, a preemption): metrics.csv's `partial` column and
  // metrics.jsonl's "partial" field say so. A resume replaces the row.
  bool partial = false;
};

const char* kind_name(LogRow::Kind kind);

// How a run ended, as the loggers record it (MLflow's run status, the
// TensorBoard session's).
struct RunEnd {
  enum class Status { finished, failed, killed };  // killed: SIGINT, SIGTERM or a preemption
  Status status = Status::finished;
  std::filesystem::path final_checkpoint;  // the newest checkpoint committed; empty: none
  bool success() const { return status == Status::finished; }
};

class Logger {
 public:
  virtual ~Logger() = default;
  // The name the manifest uses ("csv").
  virtual const char* name() const = 0;
  // Creates the file afresh (`state` empty) or continues the file a
  // checkpoint's state() describes. Called once, when the run directory may
  // be written (nothing is written before).
  virtual void open(const std::string& state) = 0;
  virtual void log(const LogRow& row) = 0;
  // Makes everything logged so far durable (fsync).
  virtual void flush() = 0;
  // Flushes, then describes the file so that open() can continue it from
  // exactly here; "" before open().
  virtual std::string state() = 0;
  // The run's hyperparameters (config/hparams.hpp), given before open(): a
  // logger that records them writes them when it creates its file (not when
  // it continues one). Others ignore them.
  virtual void set_hparams(const std::vector<HParam>& /*hparams*/) {}
  // The run has ended, after its last row. Called only on an open logger.
  virtual void finish(const RunEnd& /*end*/) {}
};

}  // namespace kiln
