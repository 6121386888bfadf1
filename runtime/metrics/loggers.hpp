// The loggers a run writes to ([logging] loggers), as one: every row goes to
// each. Rank 0 alone opens and writes them; every rank may keep and hand back
// their checkpoint state (only rank 0's is saved).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "metrics/logger.hpp"

namespace kiln {

class Loggers {
 public:
  // The names [logging] loggers accepts, in the order the docs list them.
  static const std::vector<std::string>& known_names();

  // `names` were checked by the manifest (known, no repeats).
  Loggers(const std::vector<std::string>& names, const std::filesystem::path& run_dir);
  ~Loggers();
  Loggers(Loggers&&) noexcept;
  Loggers& operator=(Loggers&&) noexcept;

  // A checkpoint's states, before open(): `csv` is metrics.csv's text (the
  // checkpoint's "metrics/csv"), `others` the lines states() returned.
  void restore(const std::string& csv, const std::string& others);
  // The run's hyperparameters (flatten_manifest_hparams(manifest.text)),
  // before open(): the TensorBoard logger writes them when it creates its
  // file (TensorBoard's HPARAMS tab; docs/logging.md).
  void set_hparams(std::vector<HParam> hparams);
  // From now on the run directory may be written. Each logger's file is
  // opened (afresh, or continuing the restored state) at the first row, so a
  // command that logs nothing (`kiln predict`) leaves the files as they were.
  void open();
  void log(const LogRow& row);
  void flush();
  // The run has ended, after its last row (`success`: without a failure):
  // the TensorBoard logger records the session's end and status. Nothing if
  // no row was logged (no file open). Never throws: a logger that cannot
  // write it warns.
  void finish(bool success);
  // For a checkpoint (flushes first): metrics.csv's text, and one line
  // "<logger> <state>" for each other logger.
  std::string csv_state();
  std::string states();

 private:
  std::vector<std::unique_ptr<Logger>> loggers_;
  void open_files();
  std::string restored_csv_, restored_others_;
  bool may_open_ = false;
  bool open_ = false;  // the files are open
};

}  // namespace kiln
